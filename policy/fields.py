"""Field checkers: the building blocks every policy kind is declared with.

A checker takes a raw value (anything a JSON, YAML or msgpack decoder can produce — or worse)
and a dotted path, and returns the value normalized to plain JSON data, or raises
:class:`PolicyError` naming the path. Checkers never recurse into data they were not told to
expect and never ``repr`` a container, so hostile input (deep nesting, huge integers, NaN,
non-string keys) can only ever produce a ``PolicyError``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from policy.errors import PolicyError

MAX_INT = 2**53 - 1
"""Largest integer any field accepts: beyond it JSON consumers (and float math) lose precision."""

MAX_LIST = 256
"""Default cap on list lengths (nodes, zones, GPUs, ...)."""

NAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._:-]{0,126}[A-Za-z0-9])?")
"""Object, node, tenant and model names (``resnet50``, ``llama-3.1-8b``, ``llama:rev2``)."""

TOKEN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
"""GPU identifiers: indices ("0"), UUIDs ("GPU-8f2…"), MIG devices ("MIG-GPU-…/1/0")."""

_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def show(value: object) -> str:
    """A short description of ``value`` for error messages.

    Containers are described, not printed, so a 100,000-deep list or a 1 MiB string cannot
    blow up (or drown) the message.
    """
    try:
        if value is None:
            return "null"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            if value.bit_length() > 64:
                return f"a {value.bit_length()}-bit integer"
            return int.__repr__(value)
        if isinstance(value, float):
            return float.__repr__(value)
        if isinstance(value, str):
            text = str.__repr__(value)
            return text if len(text) <= 64 else text[:60] + "...'"
        if isinstance(value, list | tuple):
            return f"a list of {len(value)} items"
        if isinstance(value, dict):
            return f"an object with {len(value)} keys"
        return f"a value of type {type(value).__name__}"
    except Exception:  # a hostile subclass; still describe it without failing
        return "an unprintable value"


def join(path: str, key: object) -> str:
    """``path.key`` for identifier-like keys, ``path[<key>]`` for anything else."""
    if isinstance(key, str) and _IDENT_RE.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{show(key)}]"


class Check:
    """Base checker: ``check(value, path)`` normalizes or raises; ``what`` describes the type."""

    nullable: bool = False

    @property
    def what(self) -> str:
        raise NotImplementedError

    def __call__(self, value: object, path: str) -> Any:
        if value is None and self.nullable:
            return None
        return self.convert(value, path)

    def convert(self, value: object, path: str) -> Any:
        raise NotImplementedError

    def fail(self, value: object, path: str) -> PolicyError:
        null = " or null" if self.nullable else ""
        return PolicyError(path, f"must be {self.what}{null}, got {show(value)}")


@dataclass(frozen=True)
class Raw(Check):
    """Any value, unchecked: for parts validated elsewhere (a command's embedded document)."""

    nullable: bool = True

    @property
    def what(self) -> str:
        return "any value"

    def convert(self, value: object, path: str) -> Any:
        return value


@dataclass(frozen=True)
class Boolean(Check):
    """``true``/``false`` only: 0, 1, "yes" and friends are rejected, not guessed at."""

    nullable: bool = False

    @property
    def what(self) -> str:
        return "true or false"

    def convert(self, value: object, path: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(value, path)
        return bool(value)


@dataclass(frozen=True)
class Number(Check):
    """A finite number (int or float, never bool) within the given bounds, normalized to float."""

    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    nullable: bool = False

    @property
    def what(self) -> str:
        bounds = [f"> {number_text(self.gt)}" if self.gt is not None else "",
                  f">= {number_text(self.ge)}" if self.ge is not None else "",
                  f"<= {number_text(self.le)}" if self.le is not None else ""]
        return " ".join(["a number", " and ".join(b for b in bounds if b)]).strip()

    def convert(self, value: object, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(value, path)
        try:
            number = float(value)
        except OverflowError:  # an int beyond float range
            raise self.fail(value, path) from None
        if not math.isfinite(number):
            raise self.fail(value, path)
        if ((self.gt is not None and not number > self.gt)
                or (self.ge is not None and not number >= self.ge)
                or (self.le is not None and not number <= self.le)):
            raise self.fail(value, path)
        return number


@dataclass(frozen=True)
class Integer(Check):
    """An integer within bounds (at most :data:`MAX_INT`); integral floats such as 4.0 pass."""

    ge: int | None = None
    le: int | None = None
    nullable: bool = False

    @property
    def what(self) -> str:
        if self.ge is not None and self.le is not None:
            return f"an integer in {self.ge}..{self.le}"
        if self.ge is not None:
            return f"an integer >= {self.ge}"
        return "an integer"

    def convert(self, value: object, path: str) -> int:
        if isinstance(value, bool):
            raise self.fail(value, path)
        if isinstance(value, float):
            if not (math.isfinite(value) and value.is_integer()):
                raise self.fail(value, path)
            value = int(value)
        if not isinstance(value, int):
            raise self.fail(value, path)
        number = int(value)
        if (self.ge is not None and number < self.ge) or (self.le is not None and number > self.le):
            raise self.fail(value, path)
        if abs(number) > MAX_INT:
            raise PolicyError(path, f"must be at most {MAX_INT} in magnitude, got {show(value)}")
        return number


@dataclass(frozen=True)
class Text(Check):
    """A single line of printable text without surrounding whitespace."""

    min_len: int = 1
    max_len: int = 256
    nullable: bool = False

    @property
    def what(self) -> str:
        return f"a string of {self.min_len}..{self.max_len} printable characters"

    def convert(self, value: object, path: str) -> str:
        if not isinstance(value, str):
            raise self.fail(value, path)
        text = str.__str__(value)
        if not self.min_len <= len(text) <= self.max_len:
            raise self.fail(value, path)
        # isprintable() also rejects lone surrogates, which UTF-8 / msgpack cannot encode.
        if not text.isprintable():
            raise PolicyError(path, f"must not contain control or unencodable characters, "
                                    f"got {show(value)}")
        if text != text.strip():
            raise PolicyError(path, f"must not start or end with whitespace, got {show(value)}")
        return text


@dataclass(frozen=True)
class Pattern(Check):
    """A string fully matching ``regex`` (names, GPU identifiers)."""

    regex: re.Pattern[str]
    description: str
    nullable: bool = False

    @property
    def what(self) -> str:
        return self.description

    def convert(self, value: object, path: str) -> str:
        if not isinstance(value, str):
            hint = " (quote it in YAML)" if isinstance(value, int | float) else ""
            raise PolicyError(path, f"must be {self.what}, got {show(value)}{hint}")
        text = str.__str__(value)
        if not self.regex.fullmatch(text):
            raise self.fail(value, path)
        return text


def name_check(nullable: bool = False) -> Pattern:
    """A checker for :data:`NAME_RE` names."""
    return Pattern(NAME_RE, "a name of 1..128 letters, digits, '.', '_', ':' or '-' that "
                            "starts and ends with a letter or digit", nullable)


def gpu_id_check() -> Pattern:
    """A checker for :data:`TOKEN_RE` GPU identifiers."""
    return Pattern(TOKEN_RE, "a GPU UUID or index (1..128 letters, digits, '.', '_', ':', "
                             "'/' or '-', starting with a letter or digit)")


@dataclass(frozen=True)
class Choice(Check):
    """One of a fixed set of strings."""

    options: tuple[str, ...]
    nullable: bool = False

    @property
    def what(self) -> str:
        return "one of " + ", ".join(repr(o) for o in self.options)

    def convert(self, value: object, path: str) -> str:
        if not isinstance(value, str) or value not in self.options:
            raise self.fail(value, path)
        return str.__str__(value)


@dataclass(frozen=True)
class ListOf(Check):
    """A list (or tuple) of items passing ``item``; bounded, and duplicate-free if ``unique``."""

    item: Check
    max_len: int = MAX_LIST
    unique: bool = True
    nullable: bool = False

    @property
    def what(self) -> str:
        return f"a list of at most {self.max_len} items"

    def convert(self, value: object, path: str) -> list[Any]:
        if not isinstance(value, list | tuple):
            raise self.fail(value, path)
        if len(value) > self.max_len:
            raise PolicyError(path, f"must have at most {self.max_len} items, got {len(value)}")
        out: list[Any] = []
        seen: dict[Any, int] = {}
        for i, raw in enumerate(value):
            item = self.item(raw, f"{path}[{i}]")
            if self.unique:  # items of unique lists are strings, hence hashable
                if item in seen:
                    raise PolicyError(f"{path}[{i}]", f"duplicate of {path}[{seen[item]}] "
                                                      f"{show(item)}")
                seen[item] = i
            out.append(item)
        return out


_REQUIRED: Any = object()


@dataclass(frozen=True)
class Field:
    """One key of an :class:`Object`: its checker, default (or required) and documentation."""

    check: Check
    default: Any = _REQUIRED
    doc: str = ""

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


def required(check: Check, doc: str = "") -> Field:
    """A field that must be present."""
    return Field(check, _REQUIRED, doc)


@dataclass(frozen=True)
class Object(Check):
    """A mapping with a fixed set of string keys; missing optional keys get their defaults.

    ``cross`` checks relations between fields after each one passed on its own (e.g.
    ``hedge_after_ms < deadline_ms``); it receives the normalized dict and the path.
    """

    fields: Mapping[str, Field]
    cross: Callable[[dict[str, Any], str], None] | None = None
    nullable: bool = False

    @property
    def what(self) -> str:
        return "an object with fields " + ", ".join(self.fields)

    def convert(self, value: object, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(value, path)
        for key in value:
            if not isinstance(key, str):
                raise PolicyError(join(path, key), "field names must be strings")
            if key not in self.fields:
                raise PolicyError(join(path, key), "unknown field; expected one of "
                                                   + ", ".join(self.fields))
        out: dict[str, Any] = {}
        for key, spec in self.fields.items():
            where = join(path, key)
            if key in value:
                out[key] = spec.check(value[key], where)
            elif spec.required:
                raise PolicyError(where, f"required ({spec.check.what})")
            else:  # defaults go through the checker too, which also copies lists
                out[key] = spec.check(spec.default, where)
        if self.cross is not None:
            self.cross(out, path)
        return out


def number_text(x: float) -> str:
    """``100`` for 100.0, ``2.5`` for 2.5: numbers as an operator wrote them."""
    return str(int(x)) if float(x).is_integer() else str(x)
