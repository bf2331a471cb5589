"""Policy files: parse what an operator wrote, print what ``meshctl policy get`` shows.

Input is JSON (one object or a list of objects) or YAML (one or more ``---``-separated
documents, each an object or a list of objects). YAML is read with a safe loader that also
rejects duplicate keys: PyYAML would otherwise silently keep the last ``cordoned:`` of two.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import yaml
from yaml.nodes import MappingNode, ScalarNode

from policy.errors import PolicyError
from policy.fields import show
from policy.model import Document, validate

MAX_INPUT_BYTES = 1 << 20
"""Larger inputs are refused before parsing (1 MiB holds thousands of documents)."""

MAX_DOCUMENTS = 1000
"""Most documents one input may hold."""


class _StrictSafeLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader (no arbitrary objects) that refuses duplicate mapping keys."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # complex keys are rejected later by validation; `<<` merges may repeat
            ident = (key_node.tag, key_node.value)
            if ident in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found duplicate key {key_node.value!r}", key_node.start_mark)
            seen.add(ident)
        return super().construct_mapping(node, deep=deep)


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _load(text: str, source: str) -> list[object]:
    """Decode ``text`` into top-level values (JSON if it looks like JSON, YAML otherwise)."""
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            return [json.loads(text, object_pairs_hook=_reject_duplicate_keys)]
        except json.JSONDecodeError as exc:
            raise PolicyError(source, f"invalid JSON at line {exc.lineno}, column {exc.colno}: "
                              f"{exc.msg}") from None
        except RecursionError:
            raise PolicyError(source, "invalid JSON: nested too deeply") from None
        except ValueError as exc:  # duplicate keys, integers with too many digits
            raise PolicyError(source, f"invalid JSON: {exc}") from None
    try:
        return [d for d in yaml.load_all(text, Loader=_StrictSafeLoader) if d is not None]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "syntax error"
        raise PolicyError(source, f"invalid YAML{where}: {problem}") from None
    except RecursionError:
        raise PolicyError(source, "invalid YAML: nested too deeply") from None
    except Exception as exc:  # a parser boundary: any other failure is still bad input
        raise PolicyError(source, f"invalid YAML: {type(exc).__name__}: {exc}") from None


def load_values(text: object, source: str = "<input>") -> list[object]:
    """The values of JSON or YAML ``text`` (one per YAML document), at most
    ``MAX_INPUT_BYTES`` of it, unvalidated.  Raises only :class:`PolicyError`."""
    if not isinstance(text, str):
        raise PolicyError(source, f"must be text, got {show(text)}")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_INPUT_BYTES:
        raise PolicyError(source, f"input is {size} bytes; the limit is {MAX_INPUT_BYTES}")
    return _load(text, source)


def parse_documents(text: str, source: str = "<input>") -> list[Document]:
    """Parse and validate every policy document in ``text``.

    ``source`` names the input in syntax errors. When the input holds more than one document,
    validation errors are prefixed with the document's position (``documents[1].spec.x``).
    Duplicate (kind, name) pairs are rejected, since applying both would be ambiguous. An input
    with no documents returns ``[]``. Raises only :class:`PolicyError`.
    """
    raws: list[object] = []
    for value in load_values(text, source):
        raws.extend(value if isinstance(value, list) else [value])
    if len(raws) > MAX_DOCUMENTS:
        raise PolicyError(source, f"holds {len(raws)} documents; the limit is {MAX_DOCUMENTS}")
    docs: list[Document] = []
    seen: dict[tuple[str, str], int] = {}
    for i, raw in enumerate(raws):
        where = f"documents[{i}]"
        try:
            doc = validate(raw)
        except PolicyError as exc:
            raise (exc.prefixed(where) if len(raws) > 1 else exc) from None
        if doc.key in seen:
            raise PolicyError(f"{where}.name", f"duplicate of documents[{seen[doc.key]}] "
                              f"({doc.kind} {doc.name})")
        seen[doc.key] = i
        docs.append(doc)
    return docs


def dump_documents(docs: list[dict[str, Any]], fmt: Literal["yaml", "json"] = "yaml") -> str:
    """Render plain-data documents for ``meshctl`` (keys keep their order).

    YAML is a ``---``-separated stream; JSON is always a list, so scripts see one shape
    whatever the count. Both parse back with :func:`parse_documents` when the dicts are
    envelopes (e.g. ``StoredDoc.to_manifest()``).
    """
    if fmt == "json":
        return json.dumps(docs, indent=2, allow_nan=False) + "\n"
    if fmt == "yaml":
        if not docs:
            return ""
        return yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True,
                                  default_flow_style=False, allow_unicode=True)
    raise ValueError(f"unknown format {fmt!r}; expected 'yaml' or 'json'")
