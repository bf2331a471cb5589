"""Check a KServe v2 ``ModelInferRequest`` against the model's configuration before forwarding.

The router rejects a malformed request itself - gRPC ``INVALID_ARGUMENT``, with a message that
names the tensor - instead of spending a Triton round trip (and a hedge, and a replica's queue
slot) on a request Triton would refuse anyway. :func:`validate` also returns the request's
payload size, which the scorer uses. Pure: no I/O, no numpy, no protobuf copies of the message.

What is checked, and how it relates to Triton (the gRPC frontend's ``InferGRPCToInput`` in
``server/src/grpc/infer_handler.cc`` and the core's ``InferenceRequest::Normalize`` /
``ValidateRequestInputs`` / ``ValidateBytesInputs`` in ``core/src/infer_request.cc``; every
rule was also tried against a real Triton 2.51, and ``tests/test_router_validate.py`` replays
the add_sub/delay cases against it):

- ``model_name`` must be the schema's model; ``model_version`` is not checked here.
- Inputs: every input not marked ``optional`` is present, no unknown input (Triton:
  "unexpected inference input"), no input twice (Triton: "already exists in request").
- Datatype: the request's KServe datatype string must be the config's (``TYPE_FP32`` is
  ``"FP32"``, ``TYPE_STRING`` is ``"BYTES"``, ``TYPE_BF16`` is ``"BF16"``, ...).
- Shape: with ``max_batch_size > 0`` the first request dimension is the batch size; it must be
  the same for every input (shape tensors excepted, as in Triton) and lie in
  ``1..max_batch_size``. (Triton 2.51 does not reject a batch of 0 as such; it then sizes the
  data as if the shape had no batch dimension, so it accepts ``[0, 4]`` carrying 4 elements
  and rejects ``[0, 4]`` carrying none. The router rejects every empty batch.)
  The remaining dimensions (the whole shape when ``max_batch_size == 0``) must have the
  config's rank and match ``dims``, ``-1`` matching any size. Every request dimension must be
  ``>= 0`` (Triton: "All input dimensions should be specified").
- ``reshape``: Triton checks the request against ``dims`` - the shape clients send - and only
  then rewrites the shape to ``reshape.shape`` for the backend; the element count, and so the
  byte size, is the same (Triton's config validation requires it). So ``reshape`` changes
  nothing here.
- Ragged inputs (``allow_ragged_batch``): Triton's ``Normalize`` has no special case for them -
  each request is checked against ``dims`` like any other input, and raggedness only lets the
  dynamic batcher concatenate requests whose shapes differ. Any shape that passes the batch and
  ``dims`` checks is accepted; shapes are not compared across inputs or requests.
- Data: when ``raw_input_contents`` is non-empty it must hold exactly one entry per input, in
  input order, and no input may also carry ``contents`` (Triton: "contents field must not be
  specified when using raw_input_contents"). Triton 2.51 silently ignores surplus entries;
  they are rejected here, as a request that is not what its sender meant. Otherwise
  each input carries its elements in the one typed ``contents`` field that fits its datatype
  (``int_contents`` for INT8/16/32, ``uint_contents`` for UINT8/16/32, ``int64_contents``,
  ``uint64_contents``, ``fp32_contents``, ``fp64_contents``, ``bool_contents``,
  ``bytes_contents``; FP16 and BF16 have none and must come raw) - Triton's "unexpected
  explicit tensor data" - and an input with no data at all is rejected (Triton: "unable to find
  data for input tensor").
- Byte size: fixed-size data must be exactly ``elements * element size`` bytes (Triton: "input
  byte size mismatch"); typed ``contents`` must hold exactly ``elements`` values. Raw ``BYTES``
  data is a sequence of 4-byte little-endian lengths, each followed by that many bytes; it must
  hold exactly ``elements`` strings and end exactly at the last one (Triton: "incomplete string
  length indicator", "unexpected number of string elements", "incomplete string data").
  As in Triton's core (since core PR #380, July 2024, which 2.51 has), the size checks are
  skipped for inputs with ``is_non_linear_format_io`` (TensorRT reformat-free tensors, whose
  buffers are padded; the TensorRT backend checks them), and a shape tensor's size follows its
  whole request shape. (Before that PR Triton skipped them for every ``tensorrt_*`` model.)
- Shared memory (``shared_memory_region`` on an input or a requested output) is rejected: a
  region is registered on one Triton host and cannot follow a request the router may send, or
  hedge, to any replica.
- Requested outputs must be outputs of the model (Triton: "unexpected inference output").
- The payload - the sum of the inputs' byte sizes as Triton sees them - must not exceed
  ``max_bytes`` (:class:`PayloadTooLarge`, a kind of :class:`InvalidRequest`).

Cost: one pass over the inputs with dict and tuple operations; about 5 us for a two-input
request with raw contents (upb containers are indexed, not iterated: that is several times
cheaper). Note that upb materialises a new ``bytes`` for every
``raw_input_contents[i]`` access (a copy: ~50 us per MiB), and this module reads each entry
once, for its length. Raw ``BYTES`` data costs ~0.15-0.2 us per string (a Python step each).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from math import prod

from tritonclient.grpc import model_config_pb2, service_pb2

__all__ = [
    "DATATYPES",
    "ELEMENT_SIZES",
    "InvalidRequest",
    "ModelSchema",
    "PayloadTooLarge",
    "TensorSpec",
    "validate",
]

DATATYPES: dict[int, str] = {
    model_config_pb2.TYPE_BOOL: "BOOL",
    model_config_pb2.TYPE_UINT8: "UINT8",
    model_config_pb2.TYPE_UINT16: "UINT16",
    model_config_pb2.TYPE_UINT32: "UINT32",
    model_config_pb2.TYPE_UINT64: "UINT64",
    model_config_pb2.TYPE_INT8: "INT8",
    model_config_pb2.TYPE_INT16: "INT16",
    model_config_pb2.TYPE_INT32: "INT32",
    model_config_pb2.TYPE_INT64: "INT64",
    model_config_pb2.TYPE_FP16: "FP16",
    model_config_pb2.TYPE_FP32: "FP32",
    model_config_pb2.TYPE_FP64: "FP64",
    model_config_pb2.TYPE_STRING: "BYTES",
    model_config_pb2.TYPE_BF16: "BF16",
}
"""Model-config ``DataType`` -> KServe v2 datatype string (``TYPE_INVALID`` has none)."""

ELEMENT_SIZES: dict[str, int] = {
    "BOOL": 1, "UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8,
    "INT8": 1, "INT16": 2, "INT32": 4, "INT64": 8,
    "FP16": 2, "FP32": 4, "FP64": 8, "BF16": 2,
    "BYTES": 0,
}
"""Bytes per element of each KServe datatype; 0 for ``BYTES`` (variable-size)."""

CONTENTS_FIELDS: dict[str, str] = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
"""The ``InferTensorContents`` field that carries each datatype (FP16 and BF16: none)."""

_ALL_CONTENTS_FIELDS = (
    "bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents",
    "fp32_contents", "fp64_contents", "bytes_contents",
)
_SHM_PARAM = "shared_memory_region"
_NAME_LIMIT = 128  # names longer than this are cut in messages (they travel in gRPC trailers)
_unpack_u32 = struct.Struct("<I").unpack_from


class InvalidRequest(ValueError):
    """The request does not fit the model: answer gRPC ``INVALID_ARGUMENT`` with ``str(exc)``.

    The message names the tensor or field, e.g. ``input 'INPUT0': datatype FP64 does not match
    the model's FP32``; ``tensor`` is that input's or output's name (None when the problem is
    not one tensor's, e.g. the model name)."""

    def __init__(self, message: str, tensor: str | None = None) -> None:
        super().__init__(message)
        self.tensor = tensor


class PayloadTooLarge(InvalidRequest):
    """The inputs add up to more than ``max_bytes``; ``tensor`` is the input that crossed it."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One model input as the router checks it.

    ``dims`` excludes the batch dimension (as in the model config); ``-1`` is variable.
    ``reshape`` is informational (requests are checked against ``dims``, see the module doc).
    ``check_size`` is False where Triton skips the byte-size check (``is_non_linear_format_io``
    inputs)."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False
    allow_ragged_batch: bool = False
    is_shape_tensor: bool = False
    reshape: tuple[int, ...] | None = None
    check_size: bool = True
    element_size: int = field(init=False)
    contents_field: str | None = field(init=False)
    fixed: bool = field(init=False)
    """No variable dimension: a request's dims match iff they equal ``dims``."""
    rank: int = field(init=False)
    fixed_at: tuple[tuple[int, int], ...] = field(init=False)
    """``(position, size)`` of each fixed dimension."""

    def __post_init__(self) -> None:
        if self.datatype not in ELEMENT_SIZES:
            raise ValueError(f"input {self.name!r}: unknown datatype {self.datatype!r}")
        object.__setattr__(self, "element_size", ELEMENT_SIZES[self.datatype])
        object.__setattr__(self, "contents_field", CONTENTS_FIELDS.get(self.datatype))
        object.__setattr__(self, "fixed", all(d >= 0 for d in self.dims))
        object.__setattr__(self, "rank", len(self.dims))
        object.__setattr__(self, "fixed_at",
                           tuple((i, d) for i, d in enumerate(self.dims) if d >= 0))

    @classmethod
    def from_config(cls, config: model_config_pb2.ModelInput) -> TensorSpec:
        """The spec of one ``ModelInput`` of a model configuration."""
        datatype = DATATYPES.get(config.data_type)
        if datatype is None:
            raise ValueError(f"input {config.name!r}: unsupported data_type "
                             f"{model_config_pb2.DataType.Name(config.data_type)}")
        return cls(
            name=config.name,
            datatype=datatype,
            dims=tuple(config.dims),
            optional=config.optional,
            allow_ragged_batch=config.allow_ragged_batch,
            is_shape_tensor=config.is_shape_tensor,
            reshape=tuple(config.reshape.shape) if config.HasField("reshape") else None,
            check_size=not config.is_non_linear_format_io,
        )


@dataclass(frozen=True, slots=True)
class ModelSchema:
    """What :func:`validate` needs of a model's configuration, in dicts and tuples."""

    name: str
    max_batch_size: int
    inputs: dict[str, TensorSpec]
    outputs: frozenset[str]
    required: tuple[str, ...] = field(init=False)
    """Names of the inputs that are not ``optional``, in config order."""

    def __post_init__(self) -> None:
        required = tuple(name for name, spec in self.inputs.items() if not spec.optional)
        object.__setattr__(self, "required", required)

    @classmethod
    def from_config(cls, config: model_config_pb2.ModelConfig) -> ModelSchema:
        """The schema of a ``ModelConfig`` (e.g. ``ModelConfigResponse.config``)."""
        inputs: dict[str, TensorSpec] = {}
        for model_input in config.input:
            if model_input.name in inputs:
                raise ValueError(f"model {config.name!r}: input {model_input.name!r} twice")
            inputs[model_input.name] = TensorSpec.from_config(model_input)
        return cls(
            name=config.name,
            max_batch_size=config.max_batch_size,
            inputs=inputs,
            outputs=frozenset(output.name for output in config.output),
        )


def validate(request: service_pb2.ModelInferRequest, schema: ModelSchema,
             max_bytes: int = 64 << 20) -> int:
    """Raise :class:`InvalidRequest` or return the request's payload bytes.

    The payload is the sum of the inputs' byte sizes as Triton sees them: the length of each
    ``raw_input_contents`` entry, or for typed ``contents`` ``elements * element size``
    (``BYTES``: 4 + length per string). See the module docstring for the rules."""
    if request.model_name != schema.name:
        raise InvalidRequest(f"model_name {_q(request.model_name)} does not match the model "
                             f"{_q(schema.name)}")
    inputs = request.inputs
    raw = request.raw_input_contents
    n_raw = len(raw)
    if n_raw and n_raw != len(inputs):
        raise InvalidRequest(
            f"raw_input_contents has {n_raw} entries for {len(inputs)} inputs: when it is used "
            f"it must hold exactly one entry per input, in input order")
    specs = schema.inputs
    max_batch = schema.max_batch_size
    batch = 0
    seen: set[str] = set()
    required_seen = 0
    total = 0
    # Indexing upb containers is several times cheaper than iterating them.
    for index in range(len(inputs)):
        tensor = inputs[index]
        name = tensor.name
        spec = specs.get(name)
        if spec is None:
            raise InvalidRequest(f"input {_q(name)}: the model {_q(schema.name)} has no such "
                                 f"input (inputs: {_names(specs)})", name)
        if name in seen:
            raise InvalidRequest(f"input {_q(name)}: given more than once", name)
        seen.add(name)
        if not spec.optional:
            required_seen += 1
        if tensor.datatype != spec.datatype:
            raise InvalidRequest(f"input {_q(name)}: datatype {_q(tensor.datatype, '')} does not "
                                 f"match the model's {spec.datatype}", name)
        if tensor.parameters and _SHM_PARAM in tensor.parameters:
            raise InvalidRequest(f"input {_q(name)}: shared memory inputs cannot be routed", name)

        # Shape: [batch] + dims with batching (shape tensors excepted), else dims.
        shape = tuple(tensor.shape[:])  # [:] first: far cheaper than tuple() on upb
        if max_batch > 0 and not spec.is_shape_tensor:
            if not shape:
                raise InvalidRequest(f"input {_q(name)}: shape [] has no batch dimension, the "
                                     f"model batches (max_batch_size {max_batch})", name)
            size = shape[0]
            if batch == 0:
                if not 1 <= size <= max_batch:
                    raise InvalidRequest(f"input {_q(name)}: batch size {size} is not in "
                                         f"1..{max_batch} (the model's max_batch_size)", name)
                batch = size
            elif size != batch:
                raise InvalidRequest(f"input {_q(name)}: batch size {size} differs from the "
                                     f"other inputs' {batch}", name)
            dims = shape[1:]
        else:
            dims = shape
        if spec.fixed:
            fits = dims == spec.dims
        else:
            fits = (len(dims) == spec.rank and (not dims or min(dims) >= 0)
                    and (not spec.fixed_at or all(dims[i] == d for i, d in spec.fixed_at)))
        if not fits:
            _check_dims(name, shape, dims, spec, max_batch)
        count = prod(shape)

        # Data: raw entry or typed contents; its size as Triton will see it.
        if n_raw:
            if tensor.HasField("contents"):
                raise InvalidRequest(f"input {_q(name)}: has contents although the request "
                                     f"uses raw_input_contents", name)
            data = raw[index]
            nbytes = len(data)
            total += nbytes
            if total > max_bytes:
                raise _too_large(name, total, max_bytes)
            if spec.check_size:
                if spec.element_size:
                    if nbytes != count * spec.element_size:
                        raise InvalidRequest(
                            f"input {_q(name)}: raw_input_contents[{index}] is {nbytes} bytes, "
                            f"shape {list(shape)} of {spec.datatype} needs "
                            f"{count * spec.element_size}", name)
                else:
                    _check_strings(name, data, count, shape)
        else:
            nbytes = _contents_bytes(name, tensor, spec, count, shape)
            total += nbytes
            if total > max_bytes:
                raise _too_large(name, total, max_bytes)

    if required_seen != len(schema.required):
        missing = [name for name in schema.required if name not in seen]
        raise InvalidRequest(f"input {_q(missing[0])}: missing (the model requires "
                             f"{_names(schema.required)})", missing[0])
    outputs = schema.outputs
    requested = request.outputs
    for index in range(len(requested)):
        output = requested[index]
        name = output.name
        if name not in outputs:
            raise InvalidRequest(f"output {_q(name)}: the model {_q(schema.name)} has no such "
                                 f"output (outputs: {_names(sorted(outputs))})", name)
        if output.parameters and _SHM_PARAM in output.parameters:
            raise InvalidRequest(f"output {_q(name)}: shared memory outputs cannot be routed",
                                 name)
    return total


def _check_dims(name: str, shape: tuple[int, ...], dims: tuple[int, ...], spec: TensorSpec,
                max_batch: int) -> None:
    """Raise unless ``dims`` (the shape without its batch dimension) fits ``spec.dims``."""
    want = spec.dims
    expected = ([-1] if max_batch > 0 and not spec.is_shape_tensor else []) + list(want)
    if len(dims) != len(want):
        note = " (the first dimension is the batch)" if len(expected) > len(want) else ""
        raise InvalidRequest(f"input {_q(name)}: shape {list(shape)} has rank {len(shape)}, "
                             f"the model expects {expected}{note}", name)
    for got, dim in zip(dims, want, strict=True):
        if got < 0:
            raise InvalidRequest(f"input {_q(name)}: shape {list(shape)} has a negative "
                                 f"dimension", name)
        if dim >= 0 and got != dim:
            raise InvalidRequest(f"input {_q(name)}: shape {list(shape)} does not match the "
                                 f"model's {expected}", name)


def _check_strings(name: str, data: bytes, count: int, shape: tuple[int, ...]) -> None:
    """Raise unless ``data`` is exactly ``count`` length-prefixed strings."""
    end = len(data)
    last = end - 4  # the last position a whole length prefix can start at
    pos = 0
    unpack = _unpack_u32
    for seen in range(count + 1):  # ``seen`` strings read so far; at most one too many
        if pos > last:
            if pos >= end:
                break
            raise InvalidRequest(f"input {_q(name)}: BYTES data ends inside the 4-byte length "
                                 f"of string {seen + 1}", name)
        pos += 4 + unpack(data, pos)[0]
    else:
        raise InvalidRequest(f"input {_q(name)}: BYTES data holds more than the {count} "
                             f"strings of shape {list(shape)}", name)
    if pos != end:
        raise InvalidRequest(f"input {_q(name)}: BYTES data ends inside string {seen} (its "
                             f"length says {pos - end} more bytes)", name)
    if seen != count:
        raise InvalidRequest(f"input {_q(name)}: BYTES data holds {seen} strings, shape "
                             f"{list(shape)} needs {count}", name)


def _contents_bytes(name: str, tensor: service_pb2.ModelInferRequest.InferInputTensor,
                    spec: TensorSpec, count: int, shape: tuple[int, ...]) -> int:
    """Check an input's typed ``contents``; its byte size as Triton builds it."""
    if not tensor.HasField("contents"):
        raise InvalidRequest(f"input {_q(name)}: no data (neither raw_input_contents nor "
                             f"contents)", name)
    contents = tensor.contents
    filled = [f for f in _ALL_CONTENTS_FIELDS if len(getattr(contents, f))]
    if len(filled) > 1:
        raise InvalidRequest(f"input {_q(name)}: contents has more than one field set "
                             f"({', '.join(filled)})", name)
    if filled and filled[0] != spec.contents_field:
        fits = (f"contents.{spec.contents_field}" if spec.contents_field
                else "raw_input_contents (it has no contents field)")
        raise InvalidRequest(f"input {_q(name)}: contents.{filled[0]} cannot carry "
                             f"{spec.datatype} data, use {fits}", name)
    values = getattr(contents, filled[0]) if filled else ()
    if spec.check_size and len(values) != count:
        raise InvalidRequest(f"input {_q(name)}: contents.{filled[0] if filled else '*'} holds "
                             f"{len(values)} elements, shape {list(shape)} needs {count}", name)
    if spec.element_size:
        return len(values) * spec.element_size
    return sum(4 + len(value) for value in values)


def _too_large(name: str, total: int, max_bytes: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"input {_q(name)}: the request's payload reaches {total} bytes, "
                           f"over the limit of {max_bytes}", name)


def _names(names: Iterable[str], limit: int = 8) -> str:
    """Up to ``limit`` names for a message."""
    listed = list(names)
    more = f", ... ({len(listed)} in all)" if len(listed) > limit else ""
    return ", ".join(_q(name, "") for name in listed[:limit]) + more


def _q(text: str, quote: str = "'") -> str:
    """``text`` quoted for a message, cut to a sane length."""
    if len(text) > _NAME_LIMIT:
        text = text[:_NAME_LIMIT] + "..."
    return f"{quote}{text}{quote}"
