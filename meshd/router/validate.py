"""Check a KServe v2 ``ModelInferRequest`` against the model's configuration before forwarding.

The router rejects a malformed request itself - gRPC ``INVALID_ARGUMENT`` - instead of spending
a Triton round trip (and a hedge, and a replica's queue slot) on a request Triton would refuse
anyway. :func:`validate` also returns the request's payload size, which the scorer uses. Pure:
no I/O, no numpy, no protobuf copies of the message.

What is checked, and how it relates to Triton (the gRPC frontend's ``InferGRPCToInput`` in
``server/src/grpc/infer_handler.cc`` and the core's ``InferenceRequest::Normalize`` /
``ValidateRequestInputs`` / ``ValidateBytesInputs`` in ``core/src/infer_request.cc``; every
rule was also tried against a real Triton 2.51, and ``tests/test_router_validate.py`` replays
the add_sub/delay cases against it):

- ``model_name`` must be the schema's model; ``model_version`` is not checked here.
- Inputs: every input not marked ``optional`` is present, no unknown input, no input twice.
- Datatype: the request's KServe datatype string must be the config's (``TYPE_FP32`` is
  ``"FP32"``, ``TYPE_STRING`` is ``"BYTES"``, ``TYPE_BF16`` is ``"BF16"``, ...).
- Shape: with ``max_batch_size > 0`` the first request dimension is the batch size; it must be
  the same for every input (shape tensors excepted, as in Triton) and lie in
  ``1..max_batch_size``. (Triton 2.51 does not reject a batch of 0 as such; it then sizes the
  data as if the shape had no batch dimension, so it accepts ``[0, 4]`` carrying 4 elements
  and rejects ``[0, 4]`` carrying none. The router rejects every empty batch.)
  The remaining dimensions (the whole shape when ``max_batch_size == 0``) must have the
  config's rank and match ``dims``, ``-1`` matching any size. Every request dimension must be
  ``>= 0``.
- ``reshape``: Triton checks the request against ``dims`` - the shape clients send - and only
  then rewrites the shape to ``reshape.shape`` for the backend; the element count, and so the
  byte size, is the same (Triton's config validation requires it). So ``reshape`` changes
  nothing here.
- Ragged inputs (``allow_ragged_batch``): Triton's ``Normalize`` has no special case for them -
  each request is checked against ``dims`` like any other input, and raggedness only lets the
  dynamic batcher concatenate requests whose shapes differ. Any shape that passes the batch and
  ``dims`` checks is accepted; shapes are not compared across inputs or requests.
- Data: when ``raw_input_contents`` is non-empty it must hold exactly one entry per input, in
  input order, and no input may also carry ``contents``. Triton 2.51 silently ignores surplus
  entries; they are rejected here, as a request that is not what its sender meant. Otherwise
  each input carries its elements in the one typed ``contents`` field that fits its datatype
  (``int_contents`` for INT8/16/32, ``uint_contents`` for UINT8/16/32, ``int64_contents``,
  ``uint64_contents``, ``fp32_contents``, ``fp64_contents``, ``bool_contents``,
  ``bytes_contents``; FP16 and BF16 have none and must come raw), and an input with no data
  at all is rejected.
- Byte size: fixed-size data must be exactly ``elements * element size`` bytes; typed
  ``contents`` must hold exactly ``elements`` values. Raw ``BYTES`` data is a sequence of
  4-byte little-endian lengths, each followed by that many bytes; it must hold exactly
  ``elements`` strings and end exactly at the last one. As in Triton's core (since core PR
  #380, July 2024, which 2.51 has), the size checks are skipped for inputs with
  ``is_non_linear_format_io`` (TensorRT reformat-free tensors, whose buffers are padded; the
  TensorRT backend checks them) unless they are shape tensors, and a shape tensor's size
  follows its whole request shape. (Before that PR Triton skipped them for every
  ``tensorrt_*`` model.)
- Shared memory (``shared_memory_region`` on an input or a requested output) is set apart as
  :class:`SharedMemoryRequest` (:func:`check_shared_memory`): a region lives on one host and
  cannot follow a request the router may send, or hedge, to any replica, so the router serves
  such a request itself when it runs on the client's host (:mod:`meshd.router.shm` reads the
  inputs into the request and writes the outputs back) and refuses it otherwise.
- Requested outputs must be outputs of the model.
- The payload - the sum of the inputs' byte sizes as Triton sees them - must not exceed
  ``max_bytes`` (:class:`PayloadTooLarge`, a kind of :class:`InvalidRequest`).

Messages: Triton's own. A client must see the same error through the router as from Triton
directly, so where Triton rejects a request, :class:`InvalidRequest` carries Triton 2.51's
exact message - its wording, its ``"[request id: <id>] "`` prefix where Triton's core adds one
(``<id_unknown>`` when the request's ``id`` is empty), and the mistake Triton reports *first*
when there are several - and its gRPC code (``code``; ``INVALID_ARGUMENT`` but for an unknown
model, ``NOT_FOUND``). Triton reports the first mistake in this order: inputs named twice (in
request order); each input's data in request order (``contents`` beside
``raw_input_contents``, the typed ``contents`` fields - judged by the *request's* datatype -,
missing data); shared memory; then the core: unknown requested outputs (in sorted order, a
``std::set``), the number of inputs, unknown inputs and the batch dimension, the batch size
limit, and per input its datatype, shape and byte size / ``BYTES`` data; last, a truncated
final string, which the backend reports. The core walks the inputs in the iteration order of
its ``std::unordered_map<std::string, Input>`` - libstdc++'s ``std::hash`` (``_Hash_bytes``,
seed ``0xc70f6907``) over prime bucket counts (13, 29, 59, ...), reproduced by
:func:`triton_input_order` - so it decides which of two bad inputs is reported, and the order of
"Got input(s) [...]". Triton's oddities are kept: a negative dimension other than -1 is reported
as a byte size mismatch ("Expected -16, got 16"), a shape without its batch dimension mostly as
a batch size mismatch, and Triton's own arithmetic is followed (``uint32`` batch size, int64
element counts that wrap, C strings that end at a NUL byte).

The router rejects a few requests that Triton 2.51 accepts (an empty, negative or too large
batch that Triton's ``uint32`` arithmetic lets through, surplus ``raw_input_contents``, a
required input missing while optional ones make the count right, names or datatypes that only
match up to a NUL byte, negative dimensions with no elements, sizes that only match after
int64 overflow, shared memory, the payload limit); for those the message is the router's own,
in Triton's style (the shared memory messages are still the router's older ones). The payload
limit is checked as the inputs' data is read (in request order, with Triton's frontend checks),
so a too large request reports :class:`PayloadTooLarge` before any of the core's checks.
Deliberate differences: names and request ids longer than 128 characters are cut (with "...")
and a list of names after 64 names (Triton echoes them whole, and a long one makes its reply's
trailers overflow gRPC's limit); checks that :func:`validate` does not make (request parameters,
``model_version``, output classification) are left to Triton, so a request with one of those
mistakes and one validate finds reports validate's.

Cost: one pass over the inputs with dict and tuple operations; about 5 us for a two-input
request with raw contents (upb containers are indexed, not iterated: that is several times
cheaper). Messages are built only on the error path, which replays the request in Triton's
order (:func:`_triton_check`) to find the error Triton reports. Note that upb materialises a
new ``bytes`` for every ``raw_input_contents[i]`` access (a copy: ~50 us per MiB), and the hot
path reads each entry once, for its length. Raw ``BYTES`` data costs ~0.15-0.2 us per string
(a Python step each).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from math import prod

from tritonclient.grpc import model_config_pb2, service_pb2

__all__ = [
    "DATATYPES",
    "ELEMENT_SIZES",
    "InvalidRequest",
    "ModelSchema",
    "PayloadTooLarge",
    "SharedMemoryRequest",
    "TensorSpec",
    "check_shared_memory",
    "triton_input_order",
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

# In the order Triton's gRPC frontend looks at them.
_ALL_CONTENTS_FIELDS = (
    "bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents",
    "fp32_contents", "fp64_contents", "bytes_contents",
)
_SHM_PARAM = "shared_memory_region"
_NAME_LIMIT = 128  # names longer than this are cut in messages (they travel in gRPC trailers)
_LIST_LIMIT = 64  # names listed in one message at most
_unpack_u32 = struct.Struct("<I").unpack_from
_MASK64 = (1 << 64) - 1


class InvalidRequest(ValueError):
    """The request does not fit the model: answer gRPC ``code`` with ``str(exc)``.

    The message is Triton's for the same mistake, e.g. ``[request id: <id_unknown>] inference
    input 'INPUT0' data-type is 'FP64', but model 'add_sub' expects 'FP32'``; ``tensor`` is the
    input's or output's name (None when the problem is not one tensor's, e.g. the model name or
    the batch size limit). ``code`` names the ``grpc.StatusCode``: ``"INVALID_ARGUMENT"``, or
    ``"NOT_FOUND"`` for an unknown model."""

    def __init__(self, message: str, tensor: str | None = None,
                 code: str = "INVALID_ARGUMENT") -> None:
        super().__init__(message)
        self.tensor = tensor
        self.code = code


class SharedMemoryRequest(InvalidRequest):
    """An input or requested output names a shared memory region: only a router on the
    client's host can serve it, by reading and writing the region itself."""


class PayloadTooLarge(InvalidRequest):
    """The inputs add up to more than ``max_bytes``; ``tensor`` is the input that crossed it."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One model input as the router checks it.

    ``dims`` excludes the batch dimension (as in the model config); ``-1`` is variable.
    ``reshape`` is informational (requests are checked against ``dims``, see the module doc).
    ``check_size`` is False where Triton skips the byte-size check (``is_non_linear_format_io``
    inputs that are not shape tensors)."""

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
            # Triton marks a shape tensor as such and then never as non-linear.
            check_size=config.is_shape_tensor or not config.is_non_linear_format_io,
        )


@dataclass(frozen=True, slots=True)
class ModelSchema:
    """What :func:`validate` needs of a model's configuration, in dicts and tuples."""

    name: str
    max_batch_size: int
    inputs: dict[str, TensorSpec]
    outputs: frozenset[str]
    decoupled: bool = False
    """The model may send any number of responses per request (streams only)."""
    required: tuple[str, ...] = field(init=False)
    """Names of the inputs that are not ``optional``, in config order."""
    data_free: bool = field(init=False)
    """Whether a request's validity never depends on its tensor bytes, only on their
    lengths: no input whose bytes are checked (``BYTES``, whose strings carry their own
    lengths).  Only such models' requests are recognised (:mod:`meshd.router.known`)."""

    def __post_init__(self) -> None:
        required = tuple(name for name, spec in self.inputs.items() if not spec.optional)
        object.__setattr__(self, "required", required)
        object.__setattr__(self, "data_free", all(
            spec.element_size or not spec.check_size for spec in self.inputs.values()))

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
            decoupled=config.model_transaction_policy.decoupled,
        )


def validate(request: service_pb2.ModelInferRequest, schema: ModelSchema,
             max_bytes: int = 64 << 20) -> int:
    """Raise :class:`InvalidRequest` or return the request's payload bytes.

    The payload is the sum of the inputs' byte sizes as Triton sees them: the length of each
    ``raw_input_contents`` entry, or for typed ``contents`` ``elements * element size``
    (``BYTES``: 4 + length per string). See the module docstring for the rules.

    This is the hot path: one pass in request order that raises the router's own reason at
    the first rule broken. Only then is the request replayed in Triton's order
    (:func:`_triton_check`), and Triton's message for the mistake Triton reports first replaces
    the router's; the router's stands where Triton would accept the request."""
    try:
        if request.model_name != schema.name:
            raise _unknown_model(request)
        inputs = request.inputs
        n_inputs = len(inputs)
        raw = request.raw_input_contents
        n_raw = len(raw)
        if n_raw and n_raw != n_inputs:
            if n_raw < n_inputs:
                raise _no_data(request, inputs[n_raw].name)
            raise InvalidRequest(
                f"{_prefix(request)}raw_input_contents has {n_raw} entries for {n_inputs} "
                f"inputs for model {_q(schema.name)}: when it is used it must hold exactly one "
                f"entry per input, in input order")
        specs = schema.inputs
        max_batch = schema.max_batch_size
        batch = 0
        seen: set[str] = set()
        required_seen = 0
        total = 0
        # Indexing upb containers is several times cheaper than iterating them.
        for index in range(n_inputs):
            tensor = inputs[index]
            name = tensor.name
            spec = specs.get(name)
            if spec is None:
                raise InvalidRequest(f"unexpected inference input {_q(name)} for model "
                                     f"{_q(schema.name)}", name)
            if name in seen:
                raise InvalidRequest(f"{_prefix(request)}input {_q(name)} already exists in "
                                     f"request", name)
            seen.add(name)
            if not spec.optional:
                required_seen += 1
            if tensor.datatype != spec.datatype:
                raise _datatype(request, schema, name, _q(tensor.datatype, ""), spec.datatype)
            if tensor.parameters:  # shared memory is named in parameters, if anywhere
                check_shared_memory(request)

            # Shape: [batch] + dims with batching (shape tensors excepted), else dims.
            shape = tuple(tensor.shape[:])  # [:] first: far cheaper than tuple() on upb
            if max_batch > 0 and not spec.is_shape_tensor:
                if not shape:
                    raise _no_batch_dim(request, schema, name)
                size = shape[0]
                if batch == 0:
                    if not 1 <= size <= max_batch:
                        raise InvalidRequest(
                            f"{_prefix(request)}input {_q(name)} batch size must be in "
                            f"1..{max_batch} for {_q(schema.name)}, got {size}", name)
                    batch = size
                elif size != batch:
                    raise _batch_mismatch(request, schema, name)
                dims = shape[1:]
            else:
                dims = shape
            if spec.fixed:
                fits = dims == spec.dims
            else:
                fits = (len(dims) == spec.rank and (not dims or min(dims) >= 0)
                        and (not spec.fixed_at or all(dims[i] == d for i, d in spec.fixed_at)))
            if not fits:
                _check_dims(request, schema, name, shape, dims, spec)
            count = prod(shape)

            # Data: raw entry or typed contents; its size as Triton will see it.
            if n_raw:
                if tensor.HasField("contents"):
                    raise _contents_and_raw(request, name)
                data = raw[index]
                nbytes = len(data)
                total += nbytes
                if total > max_bytes:
                    raise _too_large(request, schema, name, total, max_bytes)
                if spec.check_size:
                    if spec.element_size:
                        if nbytes != count * spec.element_size:
                            raise _byte_size(request, schema, name, count * spec.element_size,
                                             nbytes)
                    else:
                        _check_strings(request, schema, name, data, count)
            else:
                nbytes = _contents_bytes(request, schema, name, tensor, spec, count)
                total += nbytes
                if total > max_bytes:
                    raise _too_large(request, schema, name, total, max_bytes)

        if required_seen != len(schema.required):
            keys = [inputs[index].name for index in range(n_inputs)]
            raise _input_count(request, schema, triton_input_order(keys), strict=True)
        outputs = schema.outputs
        requested = request.outputs
        for index in range(len(requested)):
            output = requested[index]
            name = output.name
            if name not in outputs:
                raise _unknown_output(schema, name)
            if output.parameters:
                check_shared_memory(request)
        return total
    except SharedMemoryRequest:
        raise  # not a mistake: a router on the client's host serves it (meshd.router.shm)
    except InvalidRequest:
        try:
            _triton_check(request, schema, max_bytes)  # raises what Triton reports, if it rejects
        except InvalidRequest as triton:
            raise triton from None
        except Exception:  # noqa: BLE001 - a fault in the replay must not lose the verdict
            pass
        raise  # Triton would accept it: the router's own reason


def check_shared_memory(request: service_pb2.ModelInferRequest) -> None:
    """Raise :class:`InvalidRequest` if an input or a requested output names a shared memory
    region (``shared_memory_region``): a region lives on one Triton host."""
    inputs = request.inputs
    for index in range(len(inputs)):
        tensor = inputs[index]
        if tensor.parameters and _SHM_PARAM in tensor.parameters:
            raise SharedMemoryRequest(f"input {_q(tensor.name)}: shared memory inputs cannot "
                                      f"be routed", tensor.name)
    outputs = request.outputs
    for index in range(len(outputs)):
        output = outputs[index]
        if output.parameters and _SHM_PARAM in output.parameters:
            raise SharedMemoryRequest(f"output {_q(output.name)}: shared memory outputs cannot "
                                      f"be routed", output.name)


# --------------------------------------------------------------------------- hot path helpers


def _check_dims(request: service_pb2.ModelInferRequest, schema: ModelSchema, name: str,
                shape: tuple[int, ...], dims: tuple[int, ...], spec: TensorSpec) -> None:
    """Raise unless ``dims`` (the shape without its batch dimension) fits ``spec.dims``."""
    if len(dims) == spec.rank:
        for got, want in zip(dims, spec.dims, strict=True):
            if got < 0:
                raise _wildcard(request, schema, name, shape)
            if want >= 0 and got != want:
                break
        else:
            return
    raise _shape(request, schema, name, shape, spec)


def _check_strings(request: service_pb2.ModelInferRequest, schema: ModelSchema, name: str,
                   data: bytes, count: int) -> None:
    """Raise unless ``data`` is exactly ``count`` length-prefixed strings."""
    end = len(data)
    last = end - 4  # the last position a whole length prefix can start at
    pos = 0
    unpack = _unpack_u32
    seen = 0  # strings read so far; at most one too many
    while pos <= last and seen <= count:
        pos += 4 + unpack(data, pos)[0]
        seen += 1
    if pos != end or seen != count:
        # The error path: Triton's own walk says what is wrong.
        _triton_strings(_prefix(request), name, _q(schema.name), data, count)
        _backend_strings(name, data)
        raise _strings_count(request, schema, name, count, _count_strings(data))


def _count_strings(data: bytes) -> int:
    """How many length prefixes Triton's walk over ``data`` reads."""
    pos, seen, end = 0, 0, len(data)
    while pos + 4 <= end:
        pos += 4 + _unpack_u32(data, pos)[0]
        seen += 1
    return seen


def _contents_bytes(request: service_pb2.ModelInferRequest, schema: ModelSchema, name: str,
                    tensor: service_pb2.ModelInferRequest.InferInputTensor, spec: TensorSpec,
                    count: int) -> int:
    """Check an input's typed ``contents``; its byte size as Triton builds it."""
    if not tensor.HasField("contents"):
        raise _no_data(request, name)
    contents = tensor.contents
    filled = [f for f in _ALL_CONTENTS_FIELDS if len(getattr(contents, f))]
    if len(filled) > 1:
        raise _supplied_twice(request, name)
    if filled and filled[0] != spec.contents_field:
        raise _explicit_type(request, name, _FIELD_TYPES[filled[0]](spec.datatype),
                             spec.datatype)
    values = getattr(contents, filled[0]) if filled else ()
    if spec.element_size:
        nbytes = len(values) * spec.element_size
        if spec.check_size and len(values) != count:
            raise _byte_size(request, schema, name, count * spec.element_size, nbytes)
        return nbytes
    if spec.check_size and len(values) != count:
        raise _strings_count(request, schema, name, count, len(values))
    return sum(4 + len(value) for value in values)


# --------------------------------------------------------------------------- Triton's order


def _triton_check(request: service_pb2.ModelInferRequest, schema: ModelSchema,
                  max_bytes: int) -> int:
    """Replay Triton 2.51's handling of ``request``: raise the error it reports first, or return
    the payload where Triton accepts the request.

    The error path of :func:`validate`; slow (a few times the hot path). Follows
    ``ModelInferHandler::Execute``: ``SetInferenceRequestMetadata`` (inputs, outputs),
    ``InferGRPCToInput`` (each input's data, in request order), then the core's ``Normalize``
    (in the order of its input map) and, last, the backend's string check. Names, the id and
    datatypes pass through C strings, so they end at the first NUL byte, as do messages."""
    model = _q(schema.name)
    if request.model_name != schema.name:
        raise _unknown_model(request)
    prefix = _prefix(request)

    # SetInferenceRequestMetadata: AddInput per input, in request order.
    inputs = request.inputs
    n_inputs = len(inputs)
    keys: list[str] = []
    present: set[str] = set()
    for index in range(n_inputs):
        key = _c(inputs[index].name)
        if key in present:
            raise _e(f"{prefix}input {_q(key)} already exists in request", key)
        present.add(key)
        keys.append(key)
    requested = request.outputs
    wanted = {_c(requested[index].name) for index in range(len(requested))}

    # InferGRPCToInput: each input's data, in request order.
    check_shared_memory(request)
    raw = request.raw_input_contents
    n_raw = len(raw)
    data: dict[str, bytes | Sequence[bytes]] = {}
    sizes: dict[str, int] = {}
    total = 0
    for index in range(n_inputs):
        tensor = inputs[index]
        name = tensor.name
        key = keys[index]
        if tensor.HasField("contents"):
            if n_raw:
                raise _contents_and_raw(request, name)
            nbytes, values = _typed_contents(request, tensor)
            data[key] = values
        elif index < n_raw:
            raw_data = raw[index]
            nbytes = len(raw_data)
            data[key] = raw_data
        else:
            raise _no_data(request, name)
        sizes[key] = nbytes
        total += nbytes
        if total > max_bytes:
            raise _too_large(request, schema, name, total, max_bytes)

    # Normalize: requested outputs (a std::set: sorted), the number of inputs, the batch.
    for key in sorted(wanted):
        if key not in schema.outputs:
            raise _unknown_output(schema, key)
    order = triton_input_order(keys)
    specs = schema.inputs
    if not len(schema.required) <= len(order) <= len(specs):
        raise _input_count(request, schema, order)
    shapes = {key: tuple(inputs[index].shape[:]) for index, key in enumerate(keys)}
    max_batch = schema.max_batch_size
    batch = 0  # uint32_t, as in Triton
    for key in order:
        spec = specs.get(key)
        if spec is None:
            raise _e(f"unexpected inference input {_q(key)} for model {model}", key)
        if max_batch == 0 or spec.is_shape_tensor:
            continue
        shape = shapes[key]
        if not shape:
            raise _no_batch_dim(request, schema, key)
        if batch == 0:
            batch = shape[0] & 0xFFFFFFFF
        elif shape[0] != batch:
            raise _batch_mismatch(request, schema, key)
    if (batch - (1 << 32) if batch >> 31 else batch) > max_batch:  # (int) batch_size_
        raise _e(f"{prefix}inference request batch-size must be <= {max_batch} for {model}")

    # Normalize, per input: datatype, shape, byte size / strings.
    datatypes = {key: _c(inputs[index].datatype) for index, key in enumerate(keys)}
    for key in order:
        spec = specs[key]
        datatype = datatypes[key]
        if datatype != spec.datatype:
            shown = datatype if datatype in ELEMENT_SIZES else "<invalid>"
            raise _datatype(request, schema, key, shown, spec.datatype)
        original = shapes[key]
        shape = original if max_batch == 0 or spec.is_shape_tensor else original[1:]
        if len(shape) != spec.rank:
            raise _shape(request, schema, key, original, spec)
        for got, want in zip(shape, spec.dims, strict=True):
            if got == -1:
                raise _wildcard(request, schema, key, original)
            if want != -1 and got != want:
                raise _shape(request, schema, key, original, spec)
        if spec.reshape is not None:
            variable = [got for got, want in zip(shape, spec.dims, strict=True) if want == -1]
            shape = tuple((variable.pop(0) if variable else -1) if want == -1 else want
                          for want in spec.reshape)
        with_batch = shape if batch == 0 else (batch, *shape)
        if not spec.check_size:
            continue
        if spec.element_size:
            expected = _byte_size_of(spec.element_size,
                                     original if spec.is_shape_tensor else with_batch)
            if sizes[key] != expected:
                raise _byte_size(request, schema, key, expected, sizes[key])
        else:
            strings = data[key]
            if isinstance(strings, bytes):
                _triton_strings(prefix, key, model, strings, _element_count(with_batch))
            else:
                _triton_string_count(prefix, key, model, len(strings),
                                     _element_count(with_batch))

    # The backend: a last string cut short passes the core's walk.
    for key in order:
        strings = data[key]
        if specs[key].check_size and specs[key].datatype == "BYTES" and isinstance(strings,
                                                                                    bytes):
            _backend_strings(key, strings)
    return total


def _typed_contents(request: service_pb2.ModelInferRequest,
                    tensor: service_pb2.ModelInferRequest.InferInputTensor,
                    ) -> tuple[int, Sequence[bytes]]:
    """Triton's frontend on one input's typed ``contents``: its byte size, and its strings
    (empty unless ``bytes_contents``). Judged by the request's own datatype."""
    datatype = _c(tensor.datatype)
    if datatype not in ELEMENT_SIZES:
        datatype = "<invalid>"
    element_size = ELEMENT_SIZES.get(datatype, 0)
    contents = tensor.contents
    nbytes = 0
    strings: Sequence[bytes] = ()
    for name in _ALL_CONTENTS_FIELDS:
        values = getattr(contents, name)
        if not len(values):
            continue
        if nbytes:
            raise _supplied_twice(request, tensor.name)
        field_type = _FIELD_TYPES[name](datatype)
        if field_type != datatype:
            raise _explicit_type(request, tensor.name, field_type, datatype)
        if name == "bytes_contents":
            strings = values
            nbytes = sum(4 + len(value) for value in values)
        else:
            nbytes = len(values) * element_size
    return nbytes, strings


def _int_type(datatype: str) -> str:
    return datatype if datatype in ("INT8", "INT16") else "INT32"


def _uint_type(datatype: str) -> str:
    return datatype if datatype in ("UINT8", "UINT16") else "UINT32"


# The datatype Triton's frontend takes each contents field for, given the request's datatype.
_FIELD_TYPES = {
    "bool_contents": lambda _: "BOOL", "int_contents": _int_type,
    "int64_contents": lambda _: "INT64", "uint_contents": _uint_type,
    "uint64_contents": lambda _: "UINT64", "fp32_contents": lambda _: "FP32",
    "fp64_contents": lambda _: "FP64", "bytes_contents": lambda _: "BYTES",
}


def _triton_strings(prefix: str, key: str, model: str, data: bytes, count: int) -> None:
    """``ValidateBytesInputs`` on one raw buffer (none when it is empty) and ``count`` (int64)
    elements; raise its error."""
    remaining = len(data)
    pos = 0
    element = 0  # bytes of the current string still to come
    checked = 0
    while remaining:
        if not element:
            if remaining < 4:
                raise _e(f"{prefix}incomplete string length indicator for inference input "
                         f"{_q(key)} for model {model}, expecting 4 bytes but only {remaining} "
                         f"bytes available. Please make sure the string length indicator is "
                         f"in one buffer.", key)
            element = _unpack_u32(data, pos)[0]
            checked += 1
            if checked > count:
                raise _e(f"{prefix}unexpected number of string elements {checked} for "
                         f"inference input {_q(key)} for model {model}, expecting {count}",
                         key)
            pos += 4
            remaining -= 4
        if remaining >= element:
            pos += element
            remaining -= element
            element = 0
        else:
            element -= remaining
            remaining = 0
    _triton_string_count(prefix, key, model, checked, count)


def _triton_string_count(prefix: str, key: str, model: str, checked: int, count: int) -> None:
    """``ValidateBytesInputs`` on well-formed strings (typed ``bytes_contents``)."""
    if checked > count:
        raise _e(f"{prefix}unexpected number of string elements {count + 1} for inference "
                 f"input {_q(key)} for model {model}, expecting {count}", key)
    if checked != count:
        raise _e(f"{prefix}expected {count} string elements for inference input {_q(key)} for "
                 f"model {model}, got {checked}", key)


def _backend_strings(key: str, data: bytes) -> None:
    """The backend's walk over strings the core passed: only the last can be cut short."""
    pos, end = 0, len(data)
    while pos + 4 <= end:
        length = _unpack_u32(data, pos)[0]
        pos += 4
        if length > end - pos:
            raise _e(f"incomplete string data for inference input {_q(key)}, expecting string "
                     f"of length {length} but only {end - pos} bytes available", key)
        pos += length


def _element_count(dims: Iterable[int]) -> int:
    """Triton's ``GetElementCount``: -1 with a wildcard, 0 for no dims, int64 arithmetic."""
    count: int | None = None
    for dim in dims:
        if dim == -1:
            return -1
        count = dim if count is None else _int64(count * dim)
    return 0 if count is None else count


def _byte_size_of(element_size: int, dims: Iterable[int]) -> int:
    """Triton's ``GetByteSize`` for a fixed-size datatype."""
    count = _element_count(dims)
    return -1 if count == -1 else _int64(count * element_size)


def _int64(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >> 63 else value


# --------------------------------------------------------------------------- Triton's input map

_HASH_MUL = 0xC6A4A7935BD1E995
_HASH_SEED = 0xC70F6907
# Bucket counts of a libstdc++ unordered_map as it grows one element at a time: 13 at the first
# insert, then the next entry of libstdc++'s prime list at or above twice the count, whenever
# the element count would exceed the bucket count (max_load_factor 1).
_BUCKETS = (13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273, 20753, 42043, 85229, 172933,
            351061, 712697, 1447153, 2938679, 5967347, 12117689, 24607243, 49969847,
            101473717, 206062531, 418451333, 849749479, 1725587117, 3504151727)


def _std_hash(text: str) -> int:
    """libstdc++'s ``std::hash<std::string>`` (``_Hash_bytes``, 64-bit) of ``text`` in UTF-8."""
    data = text.encode("utf-8", "surrogatepass")
    mul, mask = _HASH_MUL, _MASK64
    length = len(data)
    aligned = length & ~7
    value = (_HASH_SEED ^ (length * mul)) & mask
    for pos in range(0, aligned, 8):
        word = (int.from_bytes(data[pos:pos + 8], "little") * mul) & mask
        value = ((value ^ (((word ^ (word >> 47)) * mul) & mask)) * mul) & mask
    if length & 7:
        value = ((value ^ int.from_bytes(data[aligned:], "little")) * mul) & mask
    value = ((value ^ (value >> 47)) * mul) & mask
    return value ^ (value >> 47)


def triton_input_order(names: Iterable[str]) -> list[str]:
    """The order in which Triton 2.51 walks a request's inputs: that of a libstdc++
    ``std::unordered_map<std::string, ...>`` into which ``names`` (distinct) were inserted
    in this order.

    A new element goes to the front of the list when its bucket is empty, else to the front of
    its bucket's run; a rehash re-inserts the list in its order. Checked against a real Triton
    2.51 for 3 to 300 inputs."""
    listed = list(names)
    hashes: list[int] = []
    after: list[int] = []  # the next node, -1 at the end; the list's head is node -1's next
    head = -1
    buckets: dict[int, int] = {}  # bucket -> the node before its run (-2: before the head)
    count = 0
    size_at = 0  # index into _BUCKETS
    n_buckets = 0

    def set_after(node: int, value: int) -> None:
        nonlocal head
        if node == -2:
            head = value
        else:
            after[node] = value

    def get_after(node: int) -> int:
        return head if node == -2 else after[node]

    for name in listed:
        code = _std_hash(name)
        if count + 1 > n_buckets:  # grow (and at the first insert)
            n_buckets = _BUCKETS[size_at] if size_at < len(_BUCKETS) else n_buckets * 2 + 1
            size_at += 1
            node, head, buckets = head, -1, {}
            begin_bucket = 0
            while node != -1:
                following = after[node]
                bucket = hashes[node] % n_buckets
                if bucket not in buckets:
                    after[node] = head
                    head = node
                    buckets[bucket] = -2
                    if after[node] != -1:
                        buckets[begin_bucket] = node
                    begin_bucket = bucket
                else:
                    before = buckets[bucket]
                    after[node] = get_after(before)
                    set_after(before, node)
                node = following
        node = count
        hashes.append(code)
        after.append(-1)
        bucket = code % n_buckets
        if bucket in buckets:
            before = buckets[bucket]
            after[node] = get_after(before)
            set_after(before, node)
        else:
            after[node] = head
            head = node
            if after[node] != -1:
                buckets[hashes[after[node]] % n_buckets] = node
            buckets[bucket] = -2
        count += 1

    order: list[str] = []
    node = head
    while node != -1:
        order.append(listed[node])
        node = after[node]
    return order


# --------------------------------------------------------------------------- messages


def _e(message: str, tensor: str | None = None) -> InvalidRequest:
    """Triton's error: its message passes through a C string, which ends at a NUL byte."""
    return InvalidRequest(message.partition("\0")[0], tensor)


def _c(text: str) -> str:
    """``text`` as Triton sees it through ``c_str()``."""
    return text.partition("\0")[0]


def _prefix(request: service_pb2.ModelInferRequest) -> str:
    """The core's ``LogRequest()``."""
    request_id = _c(request.id)
    return f"[request id: {_cut(request_id) if request_id else '<id_unknown>'}] "


def _unknown_model(request: service_pb2.ModelInferRequest) -> InvalidRequest:
    which = _q(_c(request.model_name))
    if request.model_version:
        which += f" version {_cut(request.model_version)}"
    return InvalidRequest(f"Request for unknown model: {which} is not found", None, "NOT_FOUND")


def _no_data(request: service_pb2.ModelInferRequest, name: str) -> InvalidRequest:
    return _e(f"unable to find data for input tensor {_q(name)} for model "
              f"{_q(request.model_name)} in request.", name)


def _contents_and_raw(request: service_pb2.ModelInferRequest, name: str) -> InvalidRequest:
    return _e(f"contents field must not be specified when using raw_input_contents for "
              f"{_q(name)} for model {_q(request.model_name)}", name)


def _supplied_twice(request: service_pb2.ModelInferRequest, name: str) -> InvalidRequest:
    return _e(f"unexpected explicit tensor data for input tensor {_q(name)} for model "
              f"{_q(request.model_name)}, binary data was already supplied.", name)


def _explicit_type(request: service_pb2.ModelInferRequest, name: str, field_type: str,
                   datatype: str) -> InvalidRequest:
    return _e(f"unexpected explicit tensor data for input tensor {_q(name)} for model "
              f"{_q(request.model_name)} of type '{field_type}', expected datatype "
              f"'{datatype}'", name)


def _unknown_output(schema: ModelSchema, name: str) -> InvalidRequest:
    return InvalidRequest(f"unexpected inference output {_q(name)} for model "
                          f"{_q(schema.name)}", name)


def _input_count(request: service_pb2.ModelInferRequest, schema: ModelSchema,
                 order: list[str], strict: bool = False) -> InvalidRequest:
    """``ValidateRequestInputs``: the inputs as Triton's map lists them, the missing ones in
    config order. ``strict``: the router's check of required inputs (the count may be right)."""
    present = set(order)
    missing = [name for name in schema.required if name not in present]
    total, required = len(schema.inputs), len(schema.required)
    expected = (f"{total} inputs" if total == required
                else f"number of inputs between {required} and {total}")
    tensor = missing[0] if missing else next(
        (name for name in order if name not in schema.inputs), None)
    message = (f"{_prefix(request)}expected {expected} but got {len(order)} inputs for model "
               f"{_q(schema.name)}. Got input(s) {_list(order) if order else '[]'}, but missing "
               f"required input(s) {_list(missing) if missing else ']'}. Please provide all "
               f"required input(s).")
    return InvalidRequest(message, tensor) if strict else _e(message, tensor)


def _no_batch_dim(request: service_pb2.ModelInferRequest, schema: ModelSchema,
                  name: str) -> InvalidRequest:
    return _e(f"{_prefix(request)}input {_q(name)} has no shape but model requires batch "
              f"dimension for {_q(schema.name)}", name)


def _batch_mismatch(request: service_pb2.ModelInferRequest, schema: ModelSchema,
                    name: str) -> InvalidRequest:
    return _e(f"{_prefix(request)}input {_q(name)} batch size does not match other inputs for "
              f"{_q(schema.name)}", name)


def _datatype(request: service_pb2.ModelInferRequest, schema: ModelSchema, name: str,
              got: str, want: str) -> InvalidRequest:
    return InvalidRequest(f"{_prefix(request)}inference input {_q(name)} data-type is '{got}', "
                          f"but model {_q(schema.name)} expects '{want}'", name)


def _wildcard(request: service_pb2.ModelInferRequest, schema: ModelSchema, name: str,
              shape: tuple[int, ...]) -> InvalidRequest:
    return _e(f"{_prefix(request)}All input dimensions should be specified for input "
              f"{_q(name)} for model {_q(schema.name)}, got {_dims(shape)}", name)


_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to "
    "be prepended to each input shape. If you want to specify the full shape including the "
    "batch dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size.")


def _shape(request: service_pb2.ModelInferRequest, schema: ModelSchema, name: str,
           shape: tuple[int, ...], spec: TensorSpec) -> InvalidRequest:
    batched = schema.max_batch_size > 0
    expected = (-1, *spec.dims) if batched else spec.dims
    return _e(f"{_prefix(request)}unexpected shape for input {_q(name)} for model "
              f"{_q(schema.name)}. Expected {_dims(expected)}, got {_dims(shape)}. "
              f"{_BATCH_NOTE if batched else ''}", name)


def _byte_size(request: service_pb2.ModelInferRequest, schema: ModelSchema, name: str,
               expected: int, got: int) -> InvalidRequest:
    return _e(f"{_prefix(request)}input byte size mismatch for input {_q(name)} for model "
              f"{_q(schema.name)}. Expected {expected}, got {got}", name)


def _strings_count(request: service_pb2.ModelInferRequest, schema: ModelSchema, name: str,
                   count: int, got: int) -> InvalidRequest:
    return _e(f"{_prefix(request)}expected {count} string elements for inference input "
              f"{_q(name)} for model {_q(schema.name)}, got {got}", name)


def _too_large(request: service_pb2.ModelInferRequest, schema: ModelSchema, name: str,
               total: int, max_bytes: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"{_prefix(request)}inference request payload reaches {total} bytes "
                           f"at input {_q(name)}, over the router's limit of {max_bytes} bytes "
                           f"for {_q(schema.name)}", name)


def _dims(dims: Iterable[int]) -> str:
    """Triton's ``DimsListToString``."""
    return "[" + ",".join(str(dim) for dim in dims) + "]"


def _list(names: list[str]) -> str:
    """Names as Triton lists them: ``['a','b']``; cut after ``_LIST_LIMIT`` names."""
    shown = ",".join(_q(name) for name in names[:_LIST_LIMIT])
    return f"[{shown},...]" if len(names) > _LIST_LIMIT else f"[{shown}]"


def _cut(text: str) -> str:
    return text[:_NAME_LIMIT] + "..." if len(text) > _NAME_LIMIT else text


def _q(text: str, quote: str = "'") -> str:
    """``text`` quoted for a message, cut to a sane length."""
    return f"{quote}{_cut(text)}{quote}"
