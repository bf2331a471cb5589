"""Triton's HTTP/REST request and response bodies <-> KServe v2 gRPC messages.

The router's HTTP ingress (:mod:`meshd.router.http`) speaks Triton's HTTP protocol to clients
and gRPC to Triton, so it does the conversion Triton's HTTP frontend does
(``server/src/http_server.cc`` of Triton 2.51), in the same order and with the same messages:

- An inference request is a JSON header, optionally followed by binary tensor data (the binary
  tensor data extension: the ``Inference-Header-Content-Length`` request header says where the
  JSON ends; an input with ``parameters.binary_data_size`` takes that many bytes of what
  follows, in input order).  A header length of 0 (or an empty body) is Triton's *raw* request:
  the whole body is the one input of a single-input model (:func:`raw_request`).
- Every input travels upstream in ``raw_input_contents`` - JSON ``data`` encoded as
  ``tritonclient.grpc`` would encode it (little-endian numbers, ``BYTES`` as 4-byte
  length-prefixed strings), binary data as it came - so validation and Triton see what a gRPC
  client would send.  The request's message is serialized without its tensors and the
  ``raw_input_contents`` fields are appended to it as they are (protobuf fields may come in any
  order): serializing a large message through upb costs far more than one copy.
- A response's ``raw_output_contents`` are cut out of Triton's reply as memoryviews
  (:func:`split_response`), so a binary output is copied once, into the HTTP body.
- Request parameters map to the gRPC request's parameters with the types tritonclient.grpc uses
  (``sequence_id`` int64 or string, ``sequence_start``/``sequence_end`` bool, ``priority``
  uint64, ``timeout`` int64 microseconds; others string/int64/bool/double); an output's
  ``classification`` becomes its int64 ``classification`` parameter (Triton answers with the
  classes as BYTES); ``binary_data``/``binary_data_output`` only decide how the response is
  written.
- Errors carry Triton's HTTP frontend messages.  Where Triton answers a malformed request with
  500 (its JSON accessors fail with TRITONSERVER_ERROR_INTERNAL) the router answers 400: the
  fault is the client's.  JSON syntax errors are reported in rapidjson's words
  (:func:`json_error`).

Numbers in JSON data are converted as Triton's C++ does: integers wrap into narrower types
(``300`` as UINT8 is 44), floats are rounded to FP32; FP16 and BF16 travel only as binary data.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

__all__ = [
    "BINARY",
    "JSON",
    "SHM",
    "BadRequest",
    "GenerateInput",
    "OutputError",
    "OutputPlan",
    "config_json",
    "generate_request",
    "header_length",
    "infer_request",
    "json_error",
    "load_json",
    "message_json",
    "raw_request",
    "render_generate",
    "render_infer",
    "split_response",
]

JSON, BINARY, SHM = 0, 1, 2
"""How an output is returned: JSON ``data``, binary data after the JSON, or in a region."""

_NUMPY = {
    "UINT8": "<u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
    "INT8": "<i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8",
    "FP16": "<f2", "FP32": "<f4", "FP64": "<f8",
}
_SIZES = {"BOOL": 1, "UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8, "INT8": 1, "INT16": 2,
          "INT32": 4, "INT64": 8, "FP16": 2, "FP32": 4, "FP64": 8, "BF16": 2}
_KIND = {"BOOL": "b", "UINT8": "u", "UINT16": "u", "UINT32": "u", "UINT64": "u",
         "INT8": "i", "INT16": "i", "INT32": "i", "INT64": "i", "FP32": "f", "FP64": "f"}
"""JSON-encodable datatypes (BYTES aside): bool, unsigned, signed, floating point."""
_ACCEPTS: dict[str, frozenset[type]] = {"b": frozenset({bool}), "u": frozenset({int}),
                                        "i": frozenset({int}), "f": frozenset({int, float})}
_NOT_A = {"b": "boolean as boolean", "u": "unsigned-integer as unsigned-integer",
          "i": "signed-integer as signed-integer", "f": "number as double"}
_INT64 = 1 << 63
_FP32_MAX = float(np.finfo(np.float32).max)
_UINT64 = 1 << 64
_SHM_REGION, _SHM_OFFSET, _SHM_SIZE = ("shared_memory_region", "shared_memory_offset",
                                       "shared_memory_byte_size")
_RAW_TAG = b"\x3a"  # ModelInferRequest.raw_input_contents: field 7, length-delimited
_RAW_OUTPUT_FIELD = 6  # ModelInferResponse.raw_output_contents
_SHAPE_MISMATCH = "Unable to parse 'data': Shape does not match true shape of 'data' field"
_NOT_STRING = "attempt to access JSON non-string as string"


class BadRequest(Exception):
    """A request the router answers itself: HTTP ``status`` and Triton's ``message``;
    ``plain`` for the answers Triton sends as text/plain (before it parses the body)."""

    def __init__(self, message: str, status: int = 400, plain: bool = False,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.plain = plain
        self.headers = headers


def _missing(name: str) -> str:
    return f"attempt to access non-existing object member '{name}'"


def _not_a(what: str) -> str:
    return f"attempt to access JSON non-{what}"


# --- JSON ----------------------------------------------------------------------------------------

_RAPIDJSON = {
    "Expecting property name enclosed in double quotes": "Missing a name for object member.",
    "Expecting ':' delimiter": "Missing a colon after a name of object member.",
    "Extra data": "The document root must not be followed by other values.",
    "Unterminated string starting at": "Missing a closing quotation mark in string.",
    "Invalid control character at": "Invalid encoding in string.",
    "Invalid \\escape": "Invalid escape character in string.",
    "Invalid \\uXXXX escape": "Incorrect hex digit after \\u escape in string.",
}


def load_json(body: bytes | memoryview) -> Any:
    """The JSON document in ``body`` (UTF-8; bytes that are not UTF-8 kept as lone surrogates,
    as rapidjson keeps them), or :class:`BadRequest` with Triton's message."""
    text = str(body, "utf-8", "surrogateescape")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequest(json_error(exc, text)) from None
    except RecursionError:
        raise BadRequest("failed to parse the request JSON buffer: the document nests too "
                         "deeply") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise BadRequest(f"failed to parse the request JSON buffer: {exc}") from None


def json_error(exc: json.JSONDecodeError, text: str) -> str:
    """Triton's message for a document ``json`` cannot parse (rapidjson's words and offset)."""
    pos = exc.pos
    reason = _RAPIDJSON.get(exc.msg)
    number = _number_error(text, pos)
    if number is not None:
        reason, pos = number
    elif exc.msg == "Expecting value":
        reason = "The document is empty." if not text[:pos].strip() and not text[pos:].strip() \
            else "Invalid value."
        rest = text[pos:pos + 9]
        if rest[:1] == "-":  # a sign and no number after it
            pos += 1
            rest = rest[1:]
        for word in ("true", "false", "null", "NaN", "Infinity"):
            if rest[:1] == word[0]:  # rapidjson stops at the first letter that differs
                while rest[:1] and word and rest[0] == word[0]:
                    rest, word = rest[1:], word[1:]
                    pos += 1
                break
    elif exc.msg == "Expecting ',' delimiter":
        reason = ("Missing a comma or '}' after an object member." if _innermost(text, pos) == "{"
                  else "Missing a comma or ']' after an array element.")
    elif exc.msg == "Unterminated string starting at":
        pos = len(text)  # rapidjson stops where the input ends
    elif reason is None:
        reason = "Invalid value."
    offset = len(text[:pos].encode("utf-8", "surrogateescape"))
    return f"failed to parse the request JSON buffer: {reason} at {offset}"


def _number_error(text: str, pos: int) -> tuple[str, int] | None:
    """rapidjson's error for a number cut short at ``pos`` ("1." or "1e"), where Python's
    parser reads the number before it and stumbles on what follows."""
    if not (0 < pos < len(text) and text[pos - 1].isdigit() and text[pos] in ".eE"):
        return None
    if text[pos] == ".":
        if text[pos + 1:pos + 2].isdigit():
            pos += 2
            while text[pos:pos + 1].isdigit():
                pos += 1
            if text[pos:pos + 1] not in ("e", "E"):
                return None
        else:
            return "Miss fraction part in number.", pos + 1
    pos += 1
    if text[pos:pos + 1] in ("+", "-"):
        pos += 1
    return ("Miss exponent in number.", pos) if not text[pos:pos + 1].isdigit() else None


def _innermost(text: str, end: int) -> str:
    """The bracket of the innermost container open at ``end`` ("{" or "[")."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in text[:end]:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append(ch)
        elif ch in "}]" and stack:
            stack.pop()
    return stack[-1] if stack else "["


def _is_uint(v: Any) -> bool:
    """rapidjson's IsUint64 (a JSON true is no number)."""
    return type(v) is int and 0 <= v < _UINT64


def _is_int(v: Any) -> bool:
    """rapidjson's IsInt64."""
    return type(v) is int and -_INT64 <= v < _INT64


def _is_number(v: Any) -> bool:
    return type(v) is float or type(v) is int


def _wrap64(v: int) -> int:
    """A uint64 as the int64 with the same bits (Triton's C++ casts the same way)."""
    return v - _UINT64 if v >= _INT64 else v


# --- tensor data ---------------------------------------------------------------------------------


def _flatten(data: list[Any]) -> tuple[list[Any], set[type]]:
    """The leaves of nested lists, in order, and their types."""
    while True:
        types = set(map(type, data))
        if list not in types:
            return data, types
        if types == {list}:
            data = list(chain.from_iterable(data))
            continue
        out: list[Any] = []
        stack = [iter(data)]
        while stack:
            for item in stack[-1]:
                if type(item) is list:
                    stack.append(iter(item))
                    break
                out.append(item)
            else:
                stack.pop()
        data = out


def _json_numbers(name: str, datatype: str, data: list[Any], count: int) -> Any:
    """The little-endian bytes of numeric or BOOL JSON ``data`` for ``count`` elements."""
    kind = _KIND.get(datatype)
    if kind is None:
        if datatype in ("FP16", "BF16"):
            raise BadRequest(f"receiving {datatype} data via JSON is not supported. Please use "
                             f"the binary data format for input {name}")
        raise BadRequest(f"invalid datatype for input {name}")
    flat, types = _flatten(data)
    if len(flat) == count and types <= _ACCEPTS[kind]:
        try:
            if kind == "b":
                return bytes(flat)
            if kind == "f":
                if datatype == "FP64":
                    return np.array(flat, dtype="<f8").data.cast("B")
                if flat and (max(flat) > _FP32_MAX or min(flat) < -_FP32_MAX):
                    with np.errstate(over="ignore"):  # to infinity, as C++ casts it
                        return np.array(flat, dtype=np.float64).astype("<f4").data.cast("B")
                return np.array(flat, dtype="<f4").data.cast("B")
            if kind == "u":
                if flat and min(flat) < 0:
                    raise OverflowError
                arr = np.array(flat, dtype=np.uint64)
            else:
                arr = np.array(flat, dtype=np.int64)
            return arr.astype(_NUMPY[datatype], copy=False).data.cast("B")
        except OverflowError:
            pass
    _check_numbers(data, kind, count)
    # Only a huge integer for a float can pass the checks and not convert above.
    raise BadRequest("failed to parse the request JSON buffer: Number too big to be stored in "
                     "double.")


def _check_numbers(data: list[Any], kind: str, count: int) -> None:
    """Walk ``data`` as Triton does and raise its error for the first bad element."""
    accepts: Callable[[Any], bool] = {"b": lambda v: type(v) is bool, "u": _is_uint,
                                      "i": _is_int, "f": _is_number}[kind]
    seen = 0
    for value in _flatten(data)[0]:
        if seen >= count:
            raise BadRequest(_SHAPE_MISMATCH)
        if not accepts(value):
            raise BadRequest(f"Unable to parse 'data': {_not_a(_NOT_A[kind])}")
        if kind == "f":
            try:
                float(value)
            except OverflowError:
                raise BadRequest("failed to parse the request JSON buffer: Number too big to "
                                 "be stored in double.") from None
        seen += 1
    if seen != count:
        raise BadRequest(_SHAPE_MISMATCH)


def _json_strings(data: list[Any]) -> bytes:
    """BYTES JSON ``data`` as 4-byte length-prefixed strings (any count: Triton's core checks
    it)."""
    flat, types = _flatten(data)
    if types - {str}:
        raise BadRequest(f"Unable to parse JSON bytes array: {_NOT_STRING}")
    parts = []
    for text in flat:
        raw = text.encode("utf-8", "surrogateescape")
        parts.append(len(raw).to_bytes(4, "little"))
        parts.append(raw)
    return b"".join(parts)


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _with_raw(req: service_pb2.ModelInferRequest, raws: list[Any]) -> bytes:
    """``req`` serialized with ``raws`` appended as its ``raw_input_contents``."""
    parts: list[Any] = [req.SerializeToString()]
    for data in raws:
        parts.append(_RAW_TAG)
        parts.append(_varint(len(data)))
        parts.append(data)
    return b"".join(parts)


# --- inference requests --------------------------------------------------------------------------


@dataclass(slots=True)
class OutputPlan:
    """How to write each output of the response (JSON, BINARY or SHM)."""

    default: int = JSON
    kinds: dict[str, int] = field(default_factory=dict)
    uses_shm: bool = False
    """Some input or output names a shared memory region."""
    timeout: float | None = None
    """The request's ``timeout`` parameter in seconds (None: none, or 0)."""

    def kind(self, name: str) -> int:
        return self.kinds.get(name, self.default)


def header_length(value: str | None, content_length: int) -> int:
    """Where the JSON ends (``Inference-Header-Content-Length``, read as C's atoi reads it);
    the whole body without the header."""
    if value is None:
        return content_length
    if value.isascii() and value.isdigit():  # the usual case: no atoi corner to mimic
        parsed = int(value)
        if parsed <= content_length:
            return parsed
    text = value.lstrip(" \t\n\v\f\r")
    end = 1 if text[:1] in ("+", "-") else 0
    while end < len(text) and text[end] in "0123456789":
        end += 1
    parsed = int(text[:end]) if end and text[:end] not in ("+", "-") else 0
    if parsed < 0 or parsed > content_length:
        raise BadRequest(f"inference header size should be in range (0, {content_length}), "
                         f"got: {value}", plain=True)
    return parsed


def _set_param(params: Any, key: str, value: Any) -> None:
    """A request parameter from JSON as Triton's SetTritonParameterFromJsonParameter sets it."""
    if type(value) is str:
        params[key].string_param = value
    elif _is_int(value):
        params[key].int64_param = value
    elif type(value) is bool:
        params[key].bool_param = value
    elif _is_number(value):
        try:
            params[key].double_param = float(value)
        except OverflowError:
            raise BadRequest("failed to parse the request JSON buffer: Number too big to be "
                             "stored in double.") from None
    else:
        raise BadRequest(f"parameter '{key}' has invalid type. It should be either 'int', "
                         "'bool', or 'string'.")


def _request_params(req: service_pb2.ModelInferRequest, params: Any, plan: OutputPlan) -> None:
    if not isinstance(params, dict):
        raise BadRequest("failed to get request params.: attempt to get members for non-object")
    p = req.parameters
    for key, value in params.items():
        if key == "sequence_id":
            if _is_uint(value):
                p[key].int64_param = _wrap64(value)
            elif type(value) is str:
                p[key].string_param = value
            else:
                raise BadRequest(f"Unable to parse 'sequence_id': {_NOT_STRING}")
        elif key in ("sequence_start", "sequence_end", "binary_data_output"):
            if type(value) is not bool:
                raise BadRequest(f"Unable to parse '{key}': {_not_a('boolean as boolean')}")
            if key == "binary_data_output":
                plan.default = BINARY if value else JSON
            else:
                p[key].bool_param = value
        elif key in ("priority", "timeout"):
            if not _is_uint(value):
                raise BadRequest(f"Unable to parse '{key}': "
                                 f"{_not_a('unsigned-integer as unsigned-integer')}")
            if key == "priority":
                p[key].uint64_param = value
            else:
                p[key].int64_param = min(value, _INT64 - 1)
                plan.timeout = value / 1e6 if value else None
        elif key.startswith("triton_"):
            raise BadRequest("parameter keys starting with 'triton_' are reserved for Triton "
                             "usage and should not be specified.")
        else:
            _set_param(p, key, value)


def _uint_member(obj: dict[str, Any], key: str, what: str) -> int:
    value = obj[key]
    if not _is_uint(value):
        raise BadRequest(f"{what} '{key}': {_not_a('unsigned-integer as unsigned-integer')}")
    return int(value)


def _shm_params(params: dict[str, Any], into: Any) -> None:
    """Copy a tensor's shared memory parameters to its gRPC parameters."""
    region = params[_SHM_REGION]
    if type(region) is not str:
        raise BadRequest(f"Unable to parse '{_SHM_REGION}': {_NOT_STRING}")
    into[_SHM_REGION].string_param = region
    for key in (_SHM_OFFSET, _SHM_SIZE):
        if key in params:
            into[key].int64_param = _wrap64(_uint_member(params, key, "Unable to parse"))


def _request_id(doc: Any) -> str:
    if isinstance(doc, dict) and "id" in doc:
        rid = doc["id"]
        if type(rid) is not str:
            raise BadRequest(f"Unable to parse 'id': {_NOT_STRING}")
        return rid
    return ""


def _logged(rid: str) -> str:
    """Triton's prefix for a request's messages."""
    return f"[request id: {rid or '<id_unknown>'}] "


def _string_member(obj: Any, key: str) -> str:
    if not isinstance(obj, dict) or key not in obj:
        raise BadRequest(f"Unable to parse '{key}': {_missing(key)}")
    value = obj[key]
    if type(value) is not str:
        raise BadRequest(f"Unable to parse '{key}': {_NOT_STRING}")
    return value


def infer_request(model: str, version: str, body: bytes, head: int
                  ) -> tuple[bytes, service_pb2.ModelInferRequest, OutputPlan]:
    """The gRPC request (serialized and parsed) for an HTTP inference request whose JSON is
    the first ``head`` bytes of ``body``, and how to write its response."""
    view = memoryview(body)
    doc = load_json(view[:head] if head < len(body) else body)
    req = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    plan = OutputPlan()
    try:
        raws = _parse_infer(doc, req, plan, view, head, model)
    except UnicodeEncodeError:
        raise BadRequest("failed to parse the request JSON buffer: Invalid encoding in "
                         "string.") from None
    raw = _with_raw(req, raws)
    return raw, service_pb2.ModelInferRequest.FromString(raw), plan


def _parse_infer(doc: Any, req: service_pb2.ModelInferRequest, plan: OutputPlan,
                 view: memoryview, head: int, model: str) -> list[Any]:
    rid = _request_id(doc)
    if rid:
        req.id = rid
    is_object = isinstance(doc, dict)
    if is_object and "parameters" in doc:
        _request_params(req, doc["parameters"], plan)
    inputs = doc.get("inputs") if is_object else None
    if not isinstance(inputs, list):
        raise BadRequest("Unable to parse 'inputs': " + (
            _missing("inputs") if inputs is None and not (is_object and "inputs" in doc)
            else _not_a("array as array")))
    raws: list[Any] = []
    seen: set[str] = set()
    pos = head
    end = len(view)
    for spec in inputs:
        spec_d: dict[str, Any] = spec if isinstance(spec, dict) else {}
        params = spec_d.get("parameters")
        params_d: dict[str, Any] = params if isinstance(params, dict) else {}
        has_data = "data" in spec_d
        has_binary = "binary_data_size" in params_d
        has_shm = _SHM_REGION in params_d
        if has_data + has_binary + has_shm != 1:
            message = ("Input must set only one of the following fields: 'data', "
                       "'binary_data_size' in 'parameters', 'shared_memory_region' in "
                       "'parameters'. But")
            if not (has_data or has_binary or has_shm):
                message += " no field is set"
            else:
                message += " set" + "".join(
                    f" '{what}'" for what, on in (("data", has_data),
                                                  ("binary_data_size", has_binary),
                                                  ("shared_memory_region", has_shm)) if on)
            raise BadRequest(message)
        name = _string_member(spec_d, "name")
        datatype = _string_member(spec_d, "datatype")
        shape = spec_d.get("shape")
        if not isinstance(shape, list):
            raise BadRequest("Unable to parse 'shape': " + (
                _missing("shape") if "shape" not in spec_d else _not_a("array as array")))
        for d in shape:
            if not _is_uint(d):
                raise BadRequest("Unable to parse 'shape': "
                                 f"{_not_a('unsigned-integer as unsigned-integer')}")
        if name in seen:
            raise BadRequest(f"{_logged(rid)}input '{name}' already exists in request")
        seen.add(name)
        tensor = req.inputs.add()
        tensor.name = name
        tensor.datatype = datatype
        tensor.shape.extend([_wrap64(d) for d in shape])
        if has_binary:
            size = _uint_member(params_d, "binary_data_size", "Unable to parse")
            if size and pos + size > end:
                raise BadRequest(f"unexpected size for input '{name}', expecting "
                                 f"{pos + size - end} additional bytes for model '{model}'")
            raws.append(view[pos:pos + size])
            pos += size
        elif has_shm:
            _shm_params(params_d, tensor.parameters)
            plan.uses_shm = True
            raws.append(b"")
        else:
            count = math.prod(shape)
            if count == 0:
                raws.append(b"")
                continue
            data = spec_d["data"]
            if not isinstance(data, list):
                raise BadRequest(f"Unable to parse 'data': {_not_a('array as array')}")
            if datatype == "BYTES":
                raws.append(_json_strings(data))
            else:
                raws.append(_json_numbers(name, datatype, data, count))
    if pos != end:
        raise BadRequest(f"unexpected additional input data for model '{model}'")
    if "outputs" in doc:
        outputs = doc["outputs"]
        if not isinstance(outputs, list):
            raise BadRequest(f"Unable to parse 'outputs': {_not_a('array as array')}")
        for spec in outputs:
            _requested_output(req, spec, plan)
    return raws


def _requested_output(req: service_pb2.ModelInferRequest, spec: Any, plan: OutputPlan) -> None:
    spec_d: dict[str, Any] = spec if isinstance(spec, dict) else {}
    params = spec_d.get("parameters")
    params_d: dict[str, Any] = params if isinstance(params, dict) else {}
    binary = params_d.get("binary_data", False)
    if _SHM_REGION in params_d:
        if "classification" in params_d:
            raise BadRequest("Output can't set both 'shared_memory_region' and "
                             "'classification'")
        if "binary_data" in params_d:
            if type(binary) is not bool:
                raise BadRequest(f"Unable to set 'binary_data': {_not_a('boolean as boolean')}")
            if binary:
                raise BadRequest("Output can't set both 'shared_memory_region' and "
                                 "'binary_data'")
    name = _string_member(spec_d, "name")
    out = req.outputs.add()
    out.name = name
    if "classification" in params_d:
        out.parameters["classification"].int64_param = _wrap64(
            _uint_member(params_d, "classification", "Unable to set"))
    if _SHM_REGION in params_d:
        _shm_params(params_d, out.parameters)
        plan.uses_shm = True
        plan.kinds[name] = SHM
        return
    if type(binary) is not bool:
        raise BadRequest(f"Unable to parse 'binary_data': {_not_a('boolean as boolean')}")
    plan.kinds[name] = BINARY if binary else JSON


def raw_request(model: str, version: str, body: bytes, max_batch_size: int,
                inputs: list[tuple[str, str, tuple[int, ...]]]
                ) -> tuple[bytes, service_pb2.ModelInferRequest, OutputPlan]:
    """Triton's raw binary request (no JSON: the body is the model's one input), with the
    input's datatype and shape deduced from the model's ``inputs`` (name, datatype, dims) as
    Triton's core deduces them; every output comes back as binary data."""
    prefix = _logged("")
    if len(inputs) != 1:
        raise BadRequest(f"{prefix}Raw request must only have 1 input (found 1) to be deduced "
                         f"but got {len(inputs)} inputs in '{model}' model configuration")
    name, datatype, dims = inputs[0]
    shape = [1] if max_batch_size != 0 else []
    dynamic = -1
    count = 1
    for dim in dims:
        if dim == -1:
            if dynamic != -1:
                raise BadRequest(f"{prefix}The shape of the raw input '{name}' can not be "
                                 "deduced because there are more than one variable-sized "
                                 "dimension")
            dynamic = len(shape)
        else:
            count *= dim
        shape.append(dim)
    data: Any = body
    if datatype == "BYTES":
        if dynamic != -1 or count != 1:
            raise BadRequest(f"{prefix}For BYTE datatype raw input '{name}', the model must "
                             "have input shape [1]")
        data = len(body).to_bytes(4, "little") + body
    elif dynamic != -1:
        size = count * _SIZES.get(datatype, 1)
        shape[dynamic] = len(body) // size if size else 0
    req = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    tensor = req.inputs.add()
    tensor.name = name
    tensor.datatype = datatype
    tensor.shape.extend(shape)
    raw = _with_raw(req, [data])
    return raw, service_pb2.ModelInferRequest.FromString(raw), OutputPlan(default=BINARY)


# --- generate ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GenerateInput:
    """A model input as the generate extension sees it: datatype and metadata shape (batch
    dimension included)."""

    datatype: str
    shape: tuple[int, ...]


def generate_request(model: str, version: str, body: bytes,
                     inputs: dict[str, GenerateInput]
                     ) -> tuple[bytes, service_pb2.ModelInferRequest]:
    """The gRPC request for Triton's generate extension: each top-level JSON field (and each
    field of ``parameters``) that names a model input becomes that input, its shape the
    model's with the variable dimensions filled in; any other field becomes a request
    parameter."""
    doc = load_json(body)
    rid = _request_id(doc)
    if not isinstance(doc, dict):
        raise BadRequest("attempt to get members for non-object")
    req = service_pb2.ModelInferRequest(model_name=model, model_version=version, id=rid)
    raws: list[Any] = []
    try:
        for key, value in doc.items():
            if key != "parameters":
                _generate_field(req, raws, key, value, inputs, rid)
                continue
            if "parameters" in inputs:
                raise BadRequest("Keyword 'parameters' for nested schema also given as input "
                                 "tensor name")
            if not isinstance(value, dict):
                raise BadRequest("Expected JSON object for keyword: 'parameters': "
                                 f"{_not_a('object as object')}")
            for nested, nested_value in value.items():
                try:
                    _generate_field(req, raws, nested, nested_value, inputs, rid)
                except BadRequest as exc:
                    raise BadRequest(f"Converting keyword: 'parameters': {exc.message}",
                                     exc.status) from None
    except UnicodeEncodeError:
        raise BadRequest("failed to parse the request JSON buffer: Invalid encoding in "
                         "string.") from None
    raw = _with_raw(req, raws)
    return raw, service_pb2.ModelInferRequest.FromString(raw)


def _generate_field(req: service_pb2.ModelInferRequest, raws: list[Any], name: str,
                    value: Any, inputs: dict[str, GenerateInput], rid: str) -> None:
    spec = inputs.get(name)
    if spec is None:
        _set_param(req.parameters, name, value)
        return
    data = value if isinstance(value, list) else [value]
    count = len(data)
    if spec.datatype == "BYTES":
        encoded = _json_strings(data)
    shape = list(spec.shape)
    remaining = count
    for dim in reversed(shape):
        if dim != -1:
            if dim <= 0 or remaining % dim:
                raise BadRequest(f"The schema can not convert input '{name}' to tensor with "
                                 "proper shape")
            remaining //= dim
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == -1:
            shape[i] = remaining
            remaining = 1
    if remaining != 1:
        raise BadRequest(f"The schema can not convert input '{name}' to tensor with proper "
                         "shape")
    if spec.datatype != "BYTES":
        encoded = _json_numbers(name, spec.datatype, data, count)
    if any(tensor.name == name for tensor in req.inputs):
        raise BadRequest(f"{_logged(rid)}input '{name}' already exists in request")
    tensor = req.inputs.add()
    tensor.name = name
    tensor.datatype = spec.datatype
    tensor.shape.extend(shape)
    raws.append(encoded)


# --- responses -----------------------------------------------------------------------------------


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise DecodeError("varint too long")


def split_response(reply: bytes) -> tuple[service_pb2.ModelInferResponse, list[memoryview]]:
    """A ``ModelInferResponse`` without its ``raw_output_contents``, and those as views of
    ``reply`` (no copy of the tensors)."""
    buf = memoryview(reply)
    end = len(buf)
    pos = 0
    meta: list[memoryview] = []
    raws: list[memoryview] = []
    try:
        while pos < end:
            start = pos
            key, pos = _read_varint(buf, pos)
            wire = key & 7
            if wire == 2:
                size, pos = _read_varint(buf, pos)
                if pos + size > end:
                    raise DecodeError("truncated field")
                if key >> 3 == _RAW_OUTPUT_FIELD:
                    raws.append(buf[pos:pos + size])
                    pos += size
                    continue
                pos += size
            elif wire == 0:
                _, pos = _read_varint(buf, pos)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            else:
                raise DecodeError(f"wire type {wire}")
            meta.append(buf[start:pos])
    except IndexError:
        raise DecodeError("truncated message") from None
    if pos != end:
        raise DecodeError("truncated message")
    return service_pb2.ModelInferResponse.FromString(b"".join(meta)), raws


class OutputError(Exception):
    """An output the HTTP protocol cannot carry as asked (``status`` and Triton's message)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def _output_json(name: str, datatype: str, data: memoryview, count: int) -> list[Any]:
    """An output's elements for JSON, as Triton's WriteDataToJson writes them."""
    mismatch = f"output tensor shape does not match size of output for '{name}'"
    if datatype == "BYTES":
        out: list[Any] = []
        pos, end = 0, len(data)
        for _ in range(count):
            if pos + 4 > end:
                raise OutputError(mismatch, 500)
            size = int.from_bytes(data[pos:pos + 4], "little")
            pos += 4
            if pos + size > end:
                raise OutputError(mismatch, 500)
            out.append(str(data[pos:pos + size], "utf-8", "surrogateescape"))
            pos += size
        return out
    if datatype in ("FP16", "BF16"):
        raise OutputError(f"sending {datatype} data via JSON is not supported. Please use the "
                          "binary data format for output", 400)
    if datatype == "BOOL":
        if len(data) != count:
            raise OutputError(mismatch, 500)
        return np.frombuffer(data, np.uint8).astype(bool).tolist()  # type: ignore[no-any-return]
    dtype = _NUMPY.get(datatype)
    if dtype is None:
        raise OutputError("Invalid data type for output tensor", 400)
    if len(data) != count * _SIZES[datatype]:
        raise OutputError(mismatch, 500)
    return np.frombuffer(data, dtype).tolist()  # type: ignore[no-any-return]


def _param_value(p: service_pb2.InferParameter) -> Any:
    which = p.WhichOneof("parameter_choice")
    return getattr(p, which) if which is not None else None


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode(
        "utf-8", "surrogateescape")


def render_infer(resp: service_pb2.ModelInferResponse, raws: list[memoryview],
                 plan: OutputPlan) -> tuple[bytes, int]:
    """The HTTP body of an inference response and the length of its JSON header (0: the body
    is JSON alone), or :class:`OutputError`."""
    doc: dict[str, Any] = {}
    if resp.id:
        doc["id"] = resp.id
    doc["model_name"] = resp.model_name
    doc["model_version"] = resp.model_version
    if resp.parameters:
        doc["parameters"] = {k: _param_value(v) for k, v in resp.parameters.items()}
    outputs = []
    blobs: list[memoryview] = []
    empty = memoryview(b"")
    tensors = resp.outputs
    for i in range(len(tensors)):
        tensor = tensors[i]
        name = tensor.name
        shape = tensor.shape[:]
        entry: dict[str, Any] = {"name": name, "datatype": tensor.datatype, "shape": shape}
        kind = plan.kinds.get(name, plan.default)
        data = raws[i] if i < len(raws) else empty
        if kind == BINARY:
            entry["parameters"] = {"binary_data_size": len(data)}
            if len(data):
                blobs.append(data)
        elif kind == JSON:
            entry["data"] = _output_json(name, tensor.datatype, data, math.prod(shape))
        outputs.append(entry)
    doc["outputs"] = outputs
    head = _dumps(doc)
    if not blobs:
        return head, 0
    return b"".join([head, *blobs]), len(head)


def render_generate(resp: service_pb2.ModelInferResponse, raws: list[memoryview]) -> bytes:
    """A generate response: every output (a scalar when it has one element) and response
    parameter a top-level field with ``model_name``, ``model_version`` (and ``id``), sorted
    by name as Triton writes them; or :class:`OutputError`."""
    fields: dict[str, Any] = {}
    if resp.id:
        fields["id"] = resp.id
    fields["model_name"] = resp.model_name
    fields["model_version"] = resp.model_version
    for key, value in resp.parameters.items():
        if key != "triton_final_response":  # Triton's gRPC streams add it; its HTTP has none
            fields.setdefault(key, _param_value(value))
    empty = memoryview(b"")
    tensors = resp.outputs
    for i in range(len(tensors)):
        tensor = tensors[i]
        if tensor.name in fields:
            continue
        count = math.prod(tensor.shape)
        values = _output_json(tensor.name, tensor.datatype, raws[i] if i < len(raws) else empty,
                              count)
        fields[tensor.name] = values[0] if count == 1 else values
    return _dumps(dict(sorted(fields.items())))


# --- protobuf messages as Triton's JSON ----------------------------------------------------------

_INT64_TYPES = frozenset({3, 4, 6, 16, 18})  # int64, uint64, fixed64, sfixed64, sint64
_FLOAT, _DOUBLE, _BYTES, _ENUM = 2, 1, 12, 14


def _scalar(fd: Any, value: Any, int64_strings: bool) -> Any:
    kind = fd.type
    if kind in _INT64_TYPES:
        return str(value) if int64_strings else value
    if kind == _ENUM:
        known = fd.enum_type.values_by_number.get(value)
        return known.name if known is not None else value
    if kind == _FLOAT or kind == _DOUBLE:
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        if kind == _FLOAT:
            return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))
        return value
    if kind == _BYTES:
        return base64.b64encode(value).decode("ascii")
    return value


def message_json(msg: Any, int64_strings: bool = False,
                 every_message: bool = False) -> dict[str, Any]:
    """``msg`` as protobuf's JSON mapping with proto field names and fields at their default
    values printed (Triton's ``always_print_primitive_fields``); 64-bit integers as numbers, or
    as strings as protobuf writes them when ``int64_strings``.  ``every_message`` prints unset
    message fields too (as Triton's core writes statistics: every counter, even at zero)."""
    out: dict[str, Any] = {}
    for fd in msg.DESCRIPTOR.fields:
        name = fd.name
        value = getattr(msg, name)
        if fd.is_repeated:
            entry = fd.message_type
            if entry is not None and entry.GetOptions().map_entry:
                vfd = entry.fields_by_name["value"]
                out[name] = {
                    (str(k).lower() if isinstance(k, bool) else str(k)):
                        (message_json(v, int64_strings, every_message)
                         if vfd.message_type is not None else _scalar(vfd, v, int64_strings))
                    for k, v in value.items()}
            elif entry is not None:
                out[name] = [message_json(v, int64_strings, every_message) for v in value]
            else:
                out[name] = [_scalar(fd, v, int64_strings) for v in value]
        elif fd.message_type is not None:
            if every_message or msg.HasField(name):
                out[name] = message_json(value, int64_strings, every_message)
        elif fd.has_presence and not msg.HasField(name):
            continue
        else:
            out[name] = _scalar(fd, value, int64_strings)
    return out


def _fix_ints(obj: Any, key: str) -> None:
    if isinstance(obj, dict) and key in obj:
        value = obj[key]
        obj[key] = [int(v) for v in value] if isinstance(value, list) else int(value)


def config_json(config: Any) -> dict[str, Any]:
    """A ``ModelConfig`` as Triton's HTTP API writes it: protobuf's JSON with the 64-bit
    fields Triton's core fixes up written as numbers (core ``ModelConfigToJson``; the others
    stay strings there too)."""
    doc = message_json(config, int64_strings=True)
    for io in (*doc.get("input", ()), *doc.get("output", ())):
        _fix_ints(io, "dims")
        _fix_ints(io.get("reshape"), "shape")
    _fix_ints(doc.get("version_policy", {}).get("specific"), "versions")
    db = doc.get("dynamic_batching")
    if isinstance(db, dict):
        for key in ("max_queue_delay_microseconds", "priority_levels", "default_priority_level"):
            _fix_ints(db, key)
        _fix_ints(db.get("default_queue_policy"), "default_timeout_microseconds")
        for policy in db.get("priority_queue_policy", {}).values():
            _fix_ints(policy, "default_timeout_microseconds")
    sb = doc.get("sequence_batching")
    if isinstance(sb, dict):
        _fix_ints(sb, "max_sequence_idle_microseconds")
        _fix_ints(sb.get("oldest"), "max_queue_delay_microseconds")
        _fix_ints(sb.get("direct"), "max_queue_delay_microseconds")
        for state in sb.get("state", ()):
            _fix_ints(state, "dims")
    for step in doc.get("ensemble_scheduling", {}).get("step", ()):
        _fix_ints(step, "model_version")
    for warmup in doc.get("model_warmup", ()):
        for sample in warmup.get("inputs", {}).values():
            _fix_ints(sample, "dims")
    return doc
