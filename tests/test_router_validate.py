"""``meshd.router.validate``: KServe v2 requests checked against Triton model configurations.

Requests are built the way real clients build them (``tritonclient.grpc.InferInput`` +
``set_data_from_numpy`` + the client's own request builder); configs are parsed from the real
``tests/triton_models/*/config.pbtxt``, plus inline configs for the datatypes and shape
features those two models lack. Every bad request must raise :class:`InvalidRequest` with
Triton 2.51's own message for the mistake Triton reports first, naming the tensor;
hypothesis throws arbitrary bytes and structured garbage at :func:`validate`, which must only
ever return a payload size or raise :class:`InvalidRequest` (and its replay of Triton's order
must agree with the hot path). The last test replays the add_sub/delay cases against a real
Triton: the router must reject what Triton rejects, with the same gRPC code and message.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from math import prod
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import text_format
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.grpc._utils import _get_inference_request
from tritonclient.grpc.service_pb2 import ModelInferRequest as Request
from tritonclient.utils import triton_to_np_dtype

from meshd.dev.triton import TritonServer
from meshd.router.validate import (
    CONTENTS_FIELDS,
    DATATYPES,
    ELEMENT_SIZES,
    InvalidRequest,
    ModelSchema,
    PayloadTooLarge,
    TensorSpec,
    _triton_check,
    triton_input_order,
    validate,
)

MODELS = Path(__file__).resolve().parent / "triton_models"
Mutation = Callable[[Request], object]
NO_ID = "[request id: <id_unknown>] "  # the prefix of the messages of Triton's core


def load_config(model: str) -> model_config_pb2.ModelConfig:
    """A model's real ``config.pbtxt`` as the ``ModelConfig`` proto Triton serves."""
    return parse_config((MODELS / model / "config.pbtxt").read_text())


def parse_config(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


ADD_SUB = ModelSchema.from_config(load_config("add_sub"))
DELAY = ModelSchema.from_config(load_config("delay"))

STRINGS = ModelSchema.from_config(parse_config("""
    name: "strings"  max_batch_size: 4
    input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] },
            { name: "IDS" data_type: TYPE_INT32 dims: [ 2 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""))

# One unbatched input per datatype, named after its KServe datatype. FP16 and BF16 have no
# typed contents field, so they are optional: a request with typed contents leaves them out.
ALL_TYPES = ModelSchema.from_config(parse_config(
    'name: "all_types" max_batch_size: 0 '
    + " ".join(f'input {{ name: "{dt}" data_type: {model_config_pb2.DataType.Name(t)} '
               f'dims: [ 2, -1 ] optional: {str(dt in ("FP16", "BF16")).lower()} }}'
               for t, dt in DATATYPES.items())
    + ' output { name: "OUT" data_type: TYPE_INT64 dims: [ 1 ] }'))

SHAPES = ModelSchema.from_config(parse_config("""
    name: "shapes"  max_batch_size: 2
    input [
      { name: "R" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape: { shape: [ 4 ] } },
      { name: "OPT" data_type: TYPE_INT64 dims: [ -1, 3 ] optional: true },
      { name: "RAG" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true optional: true },
      { name: "SHAPE" data_type: TYPE_INT32 dims: [ 2 ] is_shape_tensor: true optional: true },
      { name: "NL" data_type: TYPE_FP16 dims: [ 4 ] is_non_linear_format_io: true
        optional: true }
    ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""))

SCHEMAS = {schema.name: schema for schema in (ADD_SUB, DELAY, STRINGS, ALL_TYPES, SHAPES)}


def make_request(model: str, arrays: dict[str, np.ndarray],
                 outputs: tuple[str, ...] = ()) -> Request:
    """The request ``tritonclient.grpc`` sends for these numpy inputs (raw contents)."""
    inputs = []
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == np.object_ else _datatype(array.dtype)
        infer_input = grpcclient.InferInput(name, list(array.shape), datatype)
        infer_input.set_data_from_numpy(array)
        inputs.append(infer_input)
    requested = [grpcclient.InferRequestedOutput(name) for name in outputs]
    request: Request = _get_inference_request(
        model_name=model, inputs=inputs, model_version="", request_id="",
        outputs=requested or None, sequence_id=0, sequence_start=False, sequence_end=False,
        priority=0, timeout=None, parameters=None)
    return request


def _datatype(dtype: np.dtype[Any]) -> str:
    return next(dt for dt in DATATYPES.values() if np.dtype(triton_to_np_dtype(dt)) == dtype)


def add_sub_request(batch: int = 1, width: int = 4, outputs: tuple[str, ...] = ()) -> Request:
    a = np.arange(batch * width, dtype=np.float32).reshape(batch, width)
    return make_request("add_sub", {"INPUT0": a, "INPUT1": a + 1}, outputs)


def delay_request(n: int = 8) -> Request:
    return make_request("delay", {"PAYLOAD": np.zeros(n, dtype=np.float32)})


def strings_request(texts: list[list[bytes]], ids: int = 0) -> Request:
    text = np.array(texts, dtype=np.object_)
    batch = text.shape[0]
    return make_request("strings", {"TEXT": text,
                                    "IDS": np.full((batch, 2), ids, dtype=np.int32)})


def strings(*items: bytes) -> bytes:
    """``BYTES`` tensor data as Triton expects it: little-endian uint32 length + bytes each."""
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def rejected(request: Request, schema: ModelSchema, **kwargs: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        validate(request, schema, **kwargs)
    return info.value


def tensor(request: Request, name: str) -> service_pb2.ModelInferRequest.InferInputTensor:
    return next(t for t in request.inputs if t.name == name)


# --------------------------------------------------------------------------- schema


def test_schema_from_the_real_configs() -> None:
    assert ADD_SUB.name == "add_sub" and ADD_SUB.max_batch_size == 8
    assert ADD_SUB.outputs == {"OUTPUT0", "OUTPUT1"}
    assert list(ADD_SUB.inputs) == ["INPUT0", "INPUT1"] == list(ADD_SUB.required)
    spec = ADD_SUB.inputs["INPUT0"]
    assert (spec.datatype, spec.dims, spec.optional, spec.element_size, spec.check_size) == (
        "FP32", (-1,), False, 4, True)
    assert DELAY.max_batch_size == 0 and DELAY.outputs == {"NBYTES"}
    assert DELAY.inputs["PAYLOAD"] == TensorSpec("PAYLOAD", "FP32", (-1,))
    assert SHAPES.required == ("R",)
    assert SHAPES.inputs["R"].reshape == (4,) and SHAPES.inputs["R"].dims == (2, 2)
    assert SHAPES.inputs["NL"].check_size is False
    assert SHAPES.inputs["SHAPE"].is_shape_tensor and SHAPES.inputs["RAG"].allow_ragged_batch


def test_datatype_mapping_covers_every_config_type() -> None:
    names = {name: DATATYPES.get(value) for name, value in model_config_pb2.DataType.items()}
    assert names == {
        "TYPE_INVALID": None, "TYPE_BOOL": "BOOL", "TYPE_UINT8": "UINT8",
        "TYPE_UINT16": "UINT16", "TYPE_UINT32": "UINT32", "TYPE_UINT64": "UINT64",
        "TYPE_INT8": "INT8", "TYPE_INT16": "INT16", "TYPE_INT32": "INT32", "TYPE_INT64": "INT64",
        "TYPE_FP16": "FP16", "TYPE_FP32": "FP32", "TYPE_FP64": "FP64", "TYPE_STRING": "BYTES",
        "TYPE_BF16": "BF16",
    }
    for datatype, size in ELEMENT_SIZES.items():
        if datatype != "BYTES":
            assert np.dtype(triton_to_np_dtype(datatype)).itemsize == size, datatype


def test_schema_refuses_unusable_configs() -> None:
    with pytest.raises(ValueError, match="'X'"):
        ModelSchema.from_config(parse_config(
            'name: "m" input { name: "X" data_type: TYPE_INVALID dims: [1] }'))
    with pytest.raises(ValueError, match="twice"):
        ModelSchema.from_config(parse_config(
            'name: "m" input { name: "X" data_type: TYPE_FP32 dims: [1] } '
            'input { name: "X" data_type: TYPE_FP32 dims: [1] }'))
    with pytest.raises(ValueError, match="FLOAT"):
        TensorSpec("X", "FLOAT", (1,))


# --------------------------------------------------------------------------- valid requests


@pytest.mark.parametrize("batch, width", [(1, 4), (8, 1), (3, 0), (2, 1000)])
def test_add_sub_requests_pass_with_their_payload(batch: int, width: int) -> None:
    request = add_sub_request(batch, width, outputs=("OUTPUT0", "OUTPUT1"))
    assert validate(request, ADD_SUB) == 2 * batch * width * 4
    assert validate(request, ADD_SUB) == sum(len(raw) for raw in request.raw_input_contents)


@pytest.mark.parametrize("n", [0, 1, 4096])
def test_delay_requests_pass(n: int) -> None:
    assert validate(delay_request(n), DELAY) == 4 * n


def test_model_version_and_duplicate_outputs_are_fine() -> None:
    request = add_sub_request(outputs=("OUTPUT1", "OUTPUT1"))  # Triton merges duplicates
    request.model_version = "7"
    assert validate(request, ADD_SUB) == 32


def test_typed_fp32_contents_pass() -> None:
    request = Request(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[2, 3]).contents.fp32_contents \
            .extend(range(6))
    assert validate(request, ADD_SUB) == 2 * 6 * 4


def all_types_raw() -> Request:
    """Every datatype, 2x3 elements (BYTES: 2x2), the way tritonclient sends them."""
    arrays: dict[str, np.ndarray] = {}
    for datatype in DATATYPES.values():
        if datatype == "BYTES":
            arrays[datatype] = np.array([[b"ab", b""], ["c", b"\xff" * 9]], dtype=np.object_)
        else:
            arrays[datatype] = np.ones((2, 3), dtype=triton_to_np_dtype(datatype))
    return make_request("all_types", arrays)


def test_every_datatype_passes_raw_and_counts_its_bytes() -> None:
    request = all_types_raw()
    assert [t.datatype for t in request.inputs] == list(DATATYPES.values())
    expected = sum(6 * ELEMENT_SIZES[dt] for dt in DATATYPES.values())
    expected += len(strings(b"ab", b"", b"c", b"\xff" * 9))
    assert validate(request, ALL_TYPES) == expected


def all_types_typed() -> Request:
    """Every datatype that has a contents field, 2x2 elements in it."""
    special: dict[str, list[Any]] = {"BYTES": [b"a", b"b", b"", b"dd"],
                                     "BOOL": [True, False] * 2, "FP32": [0.5] * 4,
                                     "FP64": [0.25] * 4}
    request = Request(model_name="all_types")
    for datatype, field in CONTENTS_FIELDS.items():
        values = special.get(datatype, [1, 2, 3, 4])
        item = request.inputs.add(name=datatype, datatype=datatype, shape=[2, 2])
        getattr(item.contents, field).extend(values)
    return request


def test_every_typed_contents_field_passes() -> None:
    fixed = sum(4 * ELEMENT_SIZES[dt] for dt in CONTENTS_FIELDS if dt != "BYTES")
    assert validate(all_types_typed(), ALL_TYPES) == fixed + len(strings(b"a", b"b", b"", b"dd"))


def test_fp16_and_bf16_may_only_be_empty_in_contents() -> None:
    request = all_types_typed()
    request.inputs.add(name="FP16", datatype="FP16", shape=[2, 0]).contents.SetInParent()
    validate(request, ALL_TYPES)
    request.inputs.add(name="BF16", datatype="BF16", shape=[2, 1]).contents.uint_contents \
        .extend([1, 2])
    error = rejected(request, ALL_TYPES)
    assert error.tensor == "BF16"
    assert str(error) == ("unexpected explicit tensor data for input tensor 'BF16' for model "
                          "'all_types' of type 'UINT32', expected datatype 'BF16'")


def test_strings_raw_and_typed() -> None:
    request = strings_request([[b"hello", b""], [b"x", b"yz"]])
    assert validate(request, STRINGS) == len(strings(b"hello", b"", b"x", b"yz")) + 16
    typed = Request(model_name="strings")
    typed.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 3]).contents.bytes_contents \
        .extend([b"a", b"", b"bcd"])
    typed.inputs.add(name="IDS", datatype="INT32", shape=[1, 2]).contents.int_contents \
        .extend([1, 2])
    assert validate(typed, STRINGS) == (4 + 1) + 4 + (4 + 3) + 8


def test_reshape_optional_ragged_shape_tensor_and_non_linear_inputs() -> None:
    r = np.zeros((2, 2, 2), dtype=np.float32)
    # Triton checks the request against dims [2, 2], not against the reshape [4].
    assert validate(make_request("shapes", {"R": r}), SHAPES) == 32
    error = rejected(make_request("shapes", {"R": r.reshape(2, 4)}), SHAPES)
    assert error.tensor == "R" and "Expected [-1,2,2], got [2,4]." in str(error)
    # Optional inputs may be left out; present, they are checked like any other.
    opt = np.zeros((2, 0, 3), dtype=np.int64)
    assert validate(make_request("shapes", {"R": r, "OPT": opt}), SHAPES) == 32
    error = rejected(make_request("shapes", {"R": r, "OPT": np.zeros((2, 1, 2), np.int64)}),
                     SHAPES)
    assert error.tensor == "OPT"
    # Ragged: any length per request; the batch dimension still has to agree. (Triton walks
    # RAG before R - see triton_input_order - so it is R's batch that does not match.)
    for n in (0, 1, 7):
        rag = np.zeros((2, n), dtype=np.float32)
        assert validate(make_request("shapes", {"R": r, "RAG": rag}), SHAPES) == 32 + 8 * n
    error = rejected(make_request("shapes", {"R": r, "RAG": np.zeros((1, 3), np.float32)}),
                     SHAPES)
    assert triton_input_order(["R", "RAG"]) == ["RAG", "R"]
    assert str(error) == f"{NO_ID}input 'R' batch size does not match other inputs for 'shapes'"
    assert error.tensor == "R"
    # A shape tensor has no batch dimension: its whole shape is checked against dims.
    shape = np.array([3, 4], dtype=np.int32)
    assert validate(make_request("shapes", {"R": r, "SHAPE": shape}), SHAPES) == 40
    error = rejected(make_request("shapes", {"R": r, "SHAPE": shape.reshape(1, 2)}), SHAPES)
    assert error.tensor == "SHAPE"
    # Non-linear-format (reformat-free) buffers are padded: the size is the backend's business.
    request = make_request("shapes", {"R": r, "NL": np.zeros((2, 4), np.float16)})
    request.raw_input_contents[1] = bytes(64)  # 2 x 4 x FP16 padded to 32 bytes per row
    assert validate(request, SHAPES) == 32 + 64
    request.inputs[1].shape[:] = [2, 5]
    assert rejected(request, SHAPES).tensor == "NL"  # ... but not its shape


# --------------------------------------------------------------------------- bad requests


def _set(path: str, value: Any) -> Mutation:
    def mutate(request: Request) -> None:
        *parents, attr = path.split(".")
        target: Any = request
        for part in parents:
            target = target[int(part)] if part.isdigit() else getattr(target, part)
        if attr == "shape":
            target.shape[:] = value
        else:
            setattr(target, attr, value)
    return mutate


def _add_input(name: str, datatype: str = "FP32", raw: bytes | None = b"\x00" * 16) -> Mutation:
    def mutate(request: Request) -> None:
        request.inputs.add(name=name, datatype=datatype, shape=[1, 4])
        if raw is not None:
            request.raw_input_contents.append(raw)
    return mutate


def _drop_input(index: int) -> Mutation:
    def mutate(request: Request) -> None:
        del request.inputs[index]
        del request.raw_input_contents[index]
    return mutate


def _raw(index: int, edit: Callable[[bytes], bytes]) -> Mutation:
    def mutate(request: Request) -> None:
        request.raw_input_contents[index] = edit(request.raw_input_contents[index])
    return mutate


def _to_contents(**fields: list[Any]) -> Mutation:
    """Move add_sub's data from raw to typed contents; ``fields`` replace INPUT0's."""
    def mutate(request: Request) -> None:
        request.ClearField("raw_input_contents")
        for item in request.inputs:
            item.contents.fp32_contents.extend([1.0] * 4)
        if fields:
            request.inputs[0].contents.Clear()
            request.inputs[0].contents.SetInParent()
            for field, values in fields.items():
                getattr(request.inputs[0].contents, field).extend(values)
    return mutate


def _shm(kind: str) -> Mutation:
    def mutate(request: Request) -> None:
        if kind == "input":
            params = request.inputs[1].parameters
        else:
            params = request.outputs.add(name="OUTPUT0").parameters
        params["shared_memory_region"].string_param = "region"
        params["shared_memory_byte_size"].int64_param = 16
    return mutate


def _both(*mutations: Mutation) -> Mutation:
    def mutate(request: Request) -> None:
        for mutation in mutations:
            mutation(request)
    return mutate


def _unknown_inputs(count: int) -> Mutation:
    def mutate(request: Request) -> None:
        for index in range(count):
            _add_input(f"X{index}")(request)
    return mutate


def _outputs(*names: str) -> Mutation:
    def mutate(request: Request) -> None:
        for name in names:
            request.outputs.add(name=name)
    return mutate


NOTE = ("NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension "
        "to be prepended to each input shape. If you want to specify the full shape including "
        "the batch dim in your input dims config, try setting max_batch_size to zero. See the "
        "model configuration docs for more info on max_batch_size.")


def _size(name: str, expected: int, got: int) -> str:
    return (f"{NO_ID}input byte size mismatch for input '{name}' for model 'add_sub'. "
            f"Expected {expected}, got {got}")


def _batch(name: str) -> str:
    return f"{NO_ID}input '{name}' batch size does not match other inputs for 'add_sub'"


def _dtype(name: str, got: str, prefix: str = NO_ID) -> str:
    return (f"{prefix}inference input '{name}' data-type is '{got}', but model 'add_sub' "
            f"expects 'FP32'")


def _count(got: str, missing: str) -> str:
    return (f"{NO_ID}expected 2 inputs but got {got.count(',') + 1} inputs for model 'add_sub'. "
            f"Got input(s) {got}, but missing required input(s) {missing}. Please provide all "
            f"required input(s).")


# (id, mutation of a valid add_sub [1, 4] request, tensor named, the message): Triton 2.51's
# message (the real one agrees: test_router_rejects_what_triton_rejects), or the router's own
# where Triton accepts the request (_NOT_COMPARED). Triton walks add_sub's inputs as INPUT1,
# INPUT0 (triton_input_order), so of two bad inputs it reports INPUT1, and a batch size that
# differs is INPUT0's.
BAD_ADD_SUB: list[tuple[str, Mutation, str | None, str]] = [
    ("model name", _set("model_name", "add_subb"), None,
     "Request for unknown model: 'add_subb' is not found"),
    ("datatype", _set("inputs.0.datatype", "FP64"), "INPUT0", _dtype("INPUT0", "FP64")),
    ("unknown datatype", _set("inputs.1.datatype", "FLOAT32"), "INPUT1",
     _dtype("INPUT1", "<invalid>")),
    ("lowercase datatype", _set("inputs.1.datatype", "fp32"), "INPUT1",
     _dtype("INPUT1", "<invalid>")),
    ("two bad datatypes", _both(_set("inputs.0.datatype", "FP64"),
                                _set("inputs.1.datatype", "INT32")), "INPUT1",
     _dtype("INPUT1", "INT32")),
    ("request id", _both(_set("id", "req-7"), _set("inputs.0.datatype", "FP64")), "INPUT0",
     _dtype("INPUT0", "FP64", "[request id: req-7] ")),
    ("missing input", _drop_input(1), "INPUT1", _count("['INPUT0']", "['INPUT1']")),
    ("unknown input", _add_input("INPUT2"), "INPUT2",
     _count("['INPUT2','INPUT1','INPUT0']", "]")),
    ("many unknown inputs", _unknown_inputs(14), "X13", _count(
        "['X13','X11','INPUT0','INPUT1','X6','X0','X1','X2','X7','X12','X3','X4','X5','X8','X9',"
        "'X10']", "]")),
    ("unknown input for a known one", _set("inputs.0.name", "INPUT2"), "INPUT2",
     "unexpected inference input 'INPUT2' for model 'add_sub'"),
    ("duplicate input", _set("inputs.1.name", "INPUT0"), "INPUT0",
     f"{NO_ID}input 'INPUT0' already exists in request"),
    ("batch too big", _both(_set("inputs.0.shape", [9, 4]), _set("inputs.1.shape", [9, 4])),
     None, f"{NO_ID}inference request batch-size must be <= 8 for 'add_sub'"),
    ("batch 0", _both(_set("inputs.0.shape", [0, 4]), _set("inputs.1.shape", [0, 4])),
     "INPUT0", f"{NO_ID}input 'INPUT0' batch size must be in 1..8 for 'add_sub', got 0"),
    ("batch 2**32", _both(_set("inputs.0.shape", [2**32, 4]), _set("inputs.1.shape", [2**32, 4])),
     "INPUT0", f"{NO_ID}input 'INPUT0' batch size must be in 1..8 for 'add_sub', got 4294967296"),
    ("batch 2**32 + 1", _set("inputs.0.shape", [2**32 + 1, 4]), "INPUT0", _batch("INPUT0")),
    ("negative batch", _set("inputs.0.shape", [-1, 4]), "INPUT0", _batch("INPUT0")),
    ("batch mismatch", _set("inputs.1.shape", [2, 2]), "INPUT0", _batch("INPUT0")),
    ("no batch dim", _set("inputs.0.shape", []), "INPUT0",
     f"{NO_ID}input 'INPUT0' has no shape but model requires batch dimension for 'add_sub'"),
    ("rank too low", _set("inputs.0.shape", [4]), "INPUT0", _batch("INPUT0")),
    ("rank too high", _set("inputs.1.shape", [1, 2, 2]), "INPUT1",
     f"{NO_ID}unexpected shape for input 'INPUT1' for model 'add_sub'. Expected [-1,-1], got "
     f"[1,2,2]. {NOTE}"),
    ("wildcard in request", _set("inputs.0.shape", [1, -1]), "INPUT0",
     f"{NO_ID}All input dimensions should be specified for input 'INPUT0' for model 'add_sub', "
     f"got [1,-1]"),
    ("negative dim", _set("inputs.1.shape", [1, -4]), "INPUT1", _size("INPUT1", -16, 16)),
    ("size wraps", _set("inputs.0.shape", [1, 2**62]), "INPUT0", _size("INPUT0", 0, 16)),
    ("raw too short", _raw(0, lambda b: b[:-1]), "INPUT0", _size("INPUT0", 16, 15)),
    ("raw too long", _raw(1, lambda b: b + b"\x00"), "INPUT1", _size("INPUT1", 16, 17)),
    ("shape says more", _set("inputs.0.shape", [1, 5]), "INPUT0", _size("INPUT0", 20, 16)),
    ("raw for one input", lambda r: r.raw_input_contents.pop(), "INPUT1",
     "unable to find data for input tensor 'INPUT1' for model 'add_sub' in request."),
    ("raw surplus", lambda r: r.raw_input_contents.append(b""), None,
     f"{NO_ID}raw_input_contents has 3 entries for 2 inputs for model 'add_sub': when it is "
     f"used it must hold exactly one entry per input, in input order"),
    ("contents and raw", lambda r: r.inputs[1].contents.fp32_contents.append(1.0), "INPUT1",
     "contents field must not be specified when using raw_input_contents for 'INPUT1' for "
     "model 'add_sub'"),
    ("empty contents and raw", lambda r: r.inputs[0].contents.SetInParent(), "INPUT0",
     "contents field must not be specified when using raw_input_contents for 'INPUT0' for "
     "model 'add_sub'"),
    ("contents and raw after bad shape", _both(_set("inputs.0.shape", [9, 9]),
                                               lambda r: r.inputs[1].contents.SetInParent()),
     "INPUT1", "contents field must not be specified when using raw_input_contents for "
     "'INPUT1' for model 'add_sub'"),
    ("no data", _both(_to_contents(), lambda r: r.inputs[1].ClearField("contents")), "INPUT1",
     "unable to find data for input tensor 'INPUT1' for model 'add_sub' in request."),
    ("contents too few", _to_contents(fp32_contents=[1.0] * 3), "INPUT0", _size("INPUT0", 16, 12)),
    ("contents too many", _to_contents(fp32_contents=[1.0] * 5), "INPUT0",
     _size("INPUT0", 16, 20)),
    ("contents wrong field", _to_contents(int_contents=[1] * 4), "INPUT0",
     "unexpected explicit tensor data for input tensor 'INPUT0' for model 'add_sub' of type "
     "'INT32', expected datatype 'FP32'"),
    ("contents for another datatype", _both(_to_contents(), _set("inputs.0.datatype", "FP64")),
     "INPUT0", "unexpected explicit tensor data for input tensor 'INPUT0' for model 'add_sub' "
     "of type 'FP32', expected datatype 'FP64'"),
    ("contents two fields", _to_contents(fp32_contents=[1.0] * 4, fp64_contents=[1.0]),
     "INPUT0", "unexpected explicit tensor data for input tensor 'INPUT0' for model 'add_sub', "
     "binary data was already supplied."),
    ("contents all empty", _to_contents(bool_contents=[]), "INPUT0", _size("INPUT0", 16, 0)),
    ("unknown output", _outputs("OUTPUT2"), "OUTPUT2",
     "unexpected inference output 'OUTPUT2' for model 'add_sub'"),
    ("unknown outputs", _outputs("ZZ", "AA"), "AA",
     "unexpected inference output 'AA' for model 'add_sub'"),
    ("input name up to NUL", _set("inputs.0.name", "INPUT0\x00x"), "INPUT0\x00x",
     "unexpected inference input 'INPUT0\x00x' for model 'add_sub'"),
    ("datatype up to NUL", _set("inputs.1.datatype", "FP32\x00x"), "INPUT1",
     _dtype("INPUT1", "FP32\x00x")),
    ("shared memory input", _shm("input"), "INPUT1",
     "input 'INPUT1': shared memory inputs cannot be routed"),
    ("shared memory output", _shm("output"), "OUTPUT0",
     "output 'OUTPUT0': shared memory outputs cannot be routed"),
]


@pytest.mark.parametrize("mutate, name, message",
                         [case[1:] for case in BAD_ADD_SUB], ids=[case[0] for case in BAD_ADD_SUB])
def test_bad_add_sub_requests_are_rejected_naming_the_tensor(mutate: Mutation, name: str | None,
                                                             message: str) -> None:
    request = add_sub_request(outputs=("OUTPUT1",))
    assert validate(request, ADD_SUB) == 32
    mutate(request)
    error = rejected(request, ADD_SUB)
    assert error.tensor == name
    assert str(error) == message
    assert error.code == ("NOT_FOUND" if name is None and "unknown model" in message
                          else "INVALID_ARGUMENT")
    if name is not None:
        assert f"'{name}'" in str(error)


@pytest.mark.parametrize("shape, message", [
    ([1, 8], "unexpected shape for input 'PAYLOAD' for model 'delay'. Expected [-1], got [1,8]. "),
    ([], "unexpected shape for input 'PAYLOAD' for model 'delay'. Expected [-1], got []. "),
    ([-1], "All input dimensions should be specified for input 'PAYLOAD' for model 'delay', got "
           "[-1]"),
    ([9], "input byte size mismatch for input 'PAYLOAD' for model 'delay'. Expected 36, got 32"),
])
def test_bad_delay_shapes(shape: list[int], message: str) -> None:
    request = delay_request(8)
    request.inputs[0].shape[:] = shape
    error = rejected(request, DELAY)
    assert error.tensor == "PAYLOAD" and str(error) == NO_ID + message


def _elements(expected: int, got: int) -> str:
    return (f"{NO_ID}expected {expected} string elements for inference input 'TEXT' for model "
            f"'strings', got {got}")


def _indicator(available: int) -> str:
    return (f"{NO_ID}incomplete string length indicator for inference input 'TEXT' for model "
            f"'strings', expecting 4 bytes but only {available} bytes available. Please make "
            f"sure the string length indicator is in one buffer.")


def _string_data(length: int, available: int) -> str:
    # The backend's check (the core lets a cut last string through); no request id.
    return (f"incomplete string data for inference input 'TEXT', expecting string of length "
            f"{length} but only {available} bytes available")


@pytest.mark.parametrize("data, message", [
    (strings(b"ab"), _elements(2, 1)),
    (strings(b"ab", b"c", b"d"), f"{NO_ID}unexpected number of string elements 3 for inference "
                                 f"input 'TEXT' for model 'strings', expecting 2"),
    (b"", _elements(2, 0)),
    (strings(b"a" * 9), _elements(2, 1)),  # the length runs past the data: 1 string
    (strings(b"ab", b"cd")[:-1], _string_data(2, 1)),
    (strings(b"ab", b"cd") + b"\x00", _indicator(1)),
    (strings(b"ab") + b"\x07\x00", _indicator(2)),
    (strings(b"ab") + struct.pack("<I", 0xFFFFFFFF), _string_data(4294967295, 0)),
])
def test_bad_string_data(data: bytes, message: str) -> None:
    request = strings_request([[b"ab", b"cd"]])
    assert validate(request, STRINGS) == 12 + 8
    request.raw_input_contents[0] = data
    error = rejected(request, STRINGS)
    assert error.tensor == "TEXT" and str(error) == message


@pytest.mark.parametrize("values, message", [
    ([b"a", b"b", b"c"], f"{NO_ID}unexpected number of string elements 3 for inference input "
                         f"'TEXT' for model 'strings', expecting 2"),
    ([b"a"], _elements(2, 1)),
    ([], _elements(2, 0)),
])
def test_bad_typed_string_count(values: list[bytes], message: str) -> None:
    typed = Request(model_name="strings")
    text = typed.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 2])
    text.contents.SetInParent()
    text.contents.bytes_contents.extend(values)
    typed.inputs.add(name="IDS", datatype="INT32", shape=[1, 2]).contents.int_contents \
        .extend([1, 2])
    error = rejected(typed, STRINGS)
    assert error.tensor == "TEXT" and str(error) == message


# The datatype Triton's frontend takes a typed contents field for (int_contents and
# uint_contents: the 32-bit type unless the request's datatype is the 8- or 16-bit one).
_FIELD_DATATYPES = {
    "bool_contents": "BOOL", "int_contents": "INT32", "int64_contents": "INT64",
    "uint_contents": "UINT32", "uint64_contents": "UINT64", "fp32_contents": "FP32",
    "fp64_contents": "FP64", "bytes_contents": "BYTES",
}


@pytest.mark.parametrize("build, datatype", [
    *((all_types_raw, datatype) for datatype in DATATYPES.values()),
    *((all_types_typed, datatype) for datatype in CONTENTS_FIELDS),  # FP16, BF16: raw only
])
def test_each_datatype_mismatch_is_rejected(build: Callable[[], Request], datatype: str) -> None:
    request = build()
    wrong = "INT8" if datatype == "BYTES" else "BYTES"
    tensor(request, datatype).datatype = wrong
    error = rejected(request, ALL_TYPES)
    assert error.tensor == datatype
    if build is all_types_raw:  # the core compares the datatypes
        assert str(error) == (f"{NO_ID}inference input '{datatype}' data-type is '{wrong}', but "
                              f"model 'all_types' expects '{datatype}'")
    else:  # before that, the frontend reads typed contents by the request's datatype
        assert str(error) == (
            f"unexpected explicit tensor data for input tensor '{datatype}' for model "
            f"'all_types' of type '{_FIELD_DATATYPES[CONTENTS_FIELDS[datatype]]}', expected "
            f"datatype '{wrong}'")


def test_payload_limit() -> None:
    request = add_sub_request(2, 4)  # 32 + 32 bytes
    assert validate(request, ADD_SUB, max_bytes=64) == 64
    error = rejected(request, ADD_SUB, max_bytes=63)
    assert isinstance(error, PayloadTooLarge) and error.tensor == "INPUT1"
    assert "64 bytes" in str(error) and "63" in str(error)
    assert isinstance(rejected(request, ADD_SUB, max_bytes=31), PayloadTooLarge)


def test_long_names_are_cut_in_messages() -> None:
    request = add_sub_request()
    request.inputs[0].name = "N" * 100_000
    error = rejected(request, ADD_SUB)
    assert error.tensor == "N" * 100_000 and len(str(error)) < 400
    assert str(error) == f"unexpected inference input '{'N' * 128}...' for model 'add_sub'"
    request = add_sub_request()
    request.id = "i" * 1000
    request.inputs[0].datatype = "FP64"
    assert str(rejected(request, ADD_SUB)).startswith(f"[request id: {'i' * 128}...] inference")


@pytest.mark.parametrize("names, order", [
    # As a real Triton 2.51 lists them ("Got input(s) [...]"), inserted in this order.
    (["INPUT0", "INPUT1", "INPUT2"], ["INPUT2", "INPUT1", "INPUT0"]),
    # A, C and D share a bucket (of 13): a new one goes to the front of its bucket's run.
    (["A", "B", "C", "D"], ["B", "D", "C", "A"]),
    (["C", "B", "A", "D"], ["B", "D", "A", "C"]),
    (["B", "C", "A", "D"], ["D", "A", "C", "B"]),
    (["D", "C", "B", "A"], ["B", "A", "C", "D"]),
    # 16 names: past 13 the map rehashes into 29 buckets.
    (["INPUT0", "INPUT1"] + [f"X{index}" for index in range(14)],
     ["X13", "X11", "INPUT0", "INPUT1", "X6", "X0", "X1", "X2", "X7", "X12", "X3", "X4", "X5",
      "X8", "X9", "X10"]),
    ([], []),
])
def test_triton_input_order(names: list[str], order: list[str]) -> None:
    assert triton_input_order(names) == order
    assert sorted(triton_input_order(f"n{index}" for index in range(1000))) == sorted(
        f"n{index}" for index in range(1000))


def test_request_id_and_nul_bytes_as_triton_reads_them() -> None:
    # Triton reads the id, names and datatypes as C strings: they end at a NUL byte.
    request = add_sub_request()
    request.id = "abc\x00def"
    request.inputs[1].datatype = "FP16"
    assert str(rejected(request, ADD_SUB)).startswith("[request id: abc] inference input")
    request.id = "\x00"
    assert str(rejected(request, ADD_SUB)).startswith(NO_ID)
    # The frontend's message ends at the NUL of the name.
    request = add_sub_request()
    request.inputs[1].name = "INPUT1\x00x"
    request.inputs[1].contents.SetInParent()
    error = rejected(request, ADD_SUB)
    assert error.tensor == "INPUT1\x00x"
    assert str(error) == ("contents field must not be specified when using raw_input_contents "
                          "for 'INPUT1")


def test_the_replay_in_tritons_order_accepts_what_validate_accepts() -> None:
    for request, schema in [(add_sub_request(3, 2, outputs=("OUTPUT0",)), ADD_SUB),
                            (all_types_raw(), ALL_TYPES), (all_types_typed(), ALL_TYPES),
                            (strings_request([[b"a", b""]]), STRINGS)]:
        assert _triton_check(request, schema, 1 << 20) == validate(request, schema)


# --------------------------------------------------------------------------- fuzzing

FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _check_outcome(request: Request, schema: ModelSchema) -> int | InvalidRequest:
    """validate's result, which must be a payload size or an InvalidRequest - nothing else.

    Where validate accepts, its replay of Triton's order must accept too, with the same
    payload (the hot path never lets through what Triton would refuse)."""
    try:
        payload = validate(request, schema, max_bytes=1 << 16)
    except InvalidRequest as error:
        assert str(error)
        assert error.code in ("INVALID_ARGUMENT", "NOT_FOUND")
        if error.tensor is not None:  # named (up to a NUL byte, where Triton's message ends)
            assert f"'{error.tensor.partition(chr(0))[0][:128]}" in str(error)
        try:  # the replay in Triton's order raised this, or accepts (the router's own reason)
            _triton_check(request, schema, 1 << 16)
        except InvalidRequest as replayed:
            assert str(replayed) == str(error) and replayed.tensor == error.tensor
        return error
    assert isinstance(payload, int) and 0 <= payload <= 1 << 16
    if request.raw_input_contents:
        assert payload == sum(len(raw) for raw in request.raw_input_contents)
    assert _triton_check(request, schema, 1 << 16) == payload
    return payload


SEEDS = [
    add_sub_request(2, 3, outputs=("OUTPUT0",)).SerializeToString(),
    delay_request(5).SerializeToString(),
    strings_request([[b"hello", b"x"]]).SerializeToString(),
    all_types_typed().SerializeToString(),
]


@FUZZ
@given(data=st.binary(max_size=600))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    try:
        request = Request.FromString(data)
    except DecodeError:
        return
    for schema in SCHEMAS.values():
        _check_outcome(request, schema)


@FUZZ
@given(seed=st.sampled_from(SEEDS),
       edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255),
                                st.sampled_from(["set", "insert", "delete"])), max_size=6))
def test_fuzz_mutated_client_requests(seed: bytes, edits: list[tuple[int, int, str]]) -> None:
    data = bytearray(seed)
    for position, value, how in edits:
        at = position % (len(data) + 1)
        if how == "insert":
            data.insert(at, value)
        elif at < len(data):
            if how == "set":
                data[at] = value
            else:
                del data[at]
    try:
        request = Request.FromString(bytes(data))
    except DecodeError:
        return
    for schema in SCHEMAS.values():
        _check_outcome(request, schema)


_NAMES = sorted({name for s in SCHEMAS.values() for name in s.inputs}) + ["", "OUTPUT0", "é"]
_DIMS = st.one_of(st.integers(-2, 9), st.sampled_from([-(2**63), 2**63 - 1, 2**31, 2**32]))
_CONTENT_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": st.integers(-(2**63), 2**63 - 1),
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=8),
}


@st.composite
def structured_requests(draw: st.DrawFn) -> tuple[Request, ModelSchema]:
    """Requests shaped like the real thing: each part right, or now and then wrong."""
    def rarely() -> bool:
        return draw(st.integers(0, 12)) == 0

    schema = draw(st.sampled_from(list(SCHEMAS.values())))
    request = Request(model_name="other" if rarely() else schema.name)
    use_raw = draw(st.booleans())
    if rarely():
        names = draw(st.lists(st.sampled_from(_NAMES) | st.text(max_size=4), max_size=5))
    else:
        names = [name for name, spec in schema.inputs.items()
                 if not spec.optional or draw(st.booleans())]
        if rarely():
            names = draw(st.permutations(names))
    batch = draw(st.integers(-1, schema.max_batch_size + 1) if rarely()
                 else st.integers(1, max(schema.max_batch_size, 1)))
    for name in names:
        spec = schema.inputs.get(name)
        if spec is not None and not rarely():
            datatype = spec.datatype
        else:
            datatype = draw(st.sampled_from(list(ELEMENT_SIZES)) | st.text(max_size=5))
        if spec is not None and not rarely():
            dims = [d if d >= 0 else draw(st.integers(0, 3)) for d in spec.dims]
            shape = dims if schema.max_batch_size == 0 or spec.is_shape_tensor else [batch, *dims]
        else:
            shape = draw(st.lists(_DIMS, max_size=4))
        item = request.inputs.add(name=name, datatype=datatype, shape=shape)
        count = prod(shape) if all(0 <= d < 64 for d in shape) else 3
        count = count if count <= 64 else 3
        if use_raw:
            if rarely():
                raw = draw(st.binary(max_size=40))
            elif datatype == "BYTES":
                items = draw(st.lists(st.binary(max_size=5), min_size=count, max_size=count))
                raw = strings(*items)
                if rarely():
                    raw = raw[:draw(st.integers(0, len(raw)))]
            else:
                raw = bytes(count * ELEMENT_SIZES.get(datatype, 1) + rarely())
            request.raw_input_contents.append(raw)
            if rarely():
                item.contents.fp32_contents.append(1.0)
        elif not rarely():
            field = CONTENTS_FIELDS.get(datatype, "fp32_contents")
            if rarely():
                field = draw(st.sampled_from(list(_CONTENT_VALUES)))
            size = draw(st.integers(0, 5)) if rarely() else count
            item.contents.SetInParent()
            getattr(item.contents, field).extend(
                draw(st.lists(_CONTENT_VALUES[field], min_size=size, max_size=size)))
            if rarely():
                item.contents.bool_contents.append(True)
        if rarely():
            item.parameters["shared_memory_region"].string_param = "r"
    if use_raw and rarely():
        request.raw_input_contents.append(b"")
    outputs = sorted(schema.outputs) + (["NOPE"] if rarely() else [])
    for name in draw(st.lists(st.sampled_from(outputs), max_size=2)):
        request.outputs.add(name=name)
    return request, schema


@FUZZ
@given(case=structured_requests())
def test_fuzz_structured_requests(case: tuple[Request, ModelSchema]) -> None:
    request, schema = case
    _check_outcome(request, schema)
    # The same request survives the wire (what the router's gRPC server hands over).
    _check_outcome(Request.FromString(request.SerializeToString()), schema)


@FUZZ
@given(batch=st.integers(1, 8), width=st.integers(0, 40), typed=st.booleans(),
       outputs=st.lists(st.sampled_from(["OUTPUT0", "OUTPUT1"]), max_size=2))
def test_fuzz_valid_add_sub_requests_pass(batch: int, width: int, typed: bool,
                                          outputs: list[str]) -> None:
    request = add_sub_request(batch, width, outputs=tuple(outputs))
    if typed:
        _to_contents()(request)
        for item in request.inputs:
            item.contents.ClearField("fp32_contents")
            item.contents.fp32_contents.extend([0.0] * (batch * width))
    assert validate(request, ADD_SUB) == 2 * batch * width * 4


# --------------------------------------------------------------------------- real Triton

# Cases left out of the comparison, where the router knowingly differs. Triton 2.51 accepts
# these: it ignores surplus raw entries, takes a batch of 0 (or, in its uint32 arithmetic,
# 2**32) as no batch dimension (so [0, 4] with 4 elements passes), and reads names and
# datatypes up to a NUL byte; the router refuses them all, with its own message. An
# unregistered shared-memory region fails in Triton as NOT_FOUND rather than INVALID_ARGUMENT
# (the router's check of shared memory is its own for now).
_TRITON_ACCEPTS = {"raw surplus", "batch 0", "batch 2**32", "input name up to NUL",
                   "datatype up to NUL"}
_NOT_COMPARED = _TRITON_ACCEPTS | {"shared memory input", "shared memory output"}


def test_router_rejects_what_triton_rejects(triton_server: TritonServer) -> None:
    """Same verdict, and for a rejected request the same gRPC code and message, byte for byte
    (no normalisation: even the order of "Got input(s) [...]" is Triton's, see
    triton_input_order)."""
    with grpc.insecure_channel(triton_server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        live = {m: ModelSchema.from_config(
            stub.ModelConfig(service_pb2.ModelConfigRequest(name=m), timeout=10).config)
            for m in ("add_sub", "delay")}
        # The config Triton serves (auto-completed) means the same as the file.
        assert live == {"add_sub": ADD_SUB, "delay": DELAY}

        cases: list[tuple[str, Request, ModelSchema]] = [
            ("add_sub ok", add_sub_request(3, 5, outputs=("OUTPUT0",)), ADD_SUB),
            ("add_sub empty", add_sub_request(1, 0), ADD_SUB),
            ("delay ok", delay_request(6), DELAY),
            ("delay empty", delay_request(0), DELAY),
        ]
        for label, mutate, _, _ in BAD_ADD_SUB:
            if label not in _NOT_COMPARED:
                request = add_sub_request(outputs=("OUTPUT1",))
                mutate(request)
                cases.append((label, request, ADD_SUB))
        for shape in ([1, 8], [], [-1], [9]):
            request = delay_request(8)
            request.inputs[0].shape[:] = shape
            cases.append((f"delay shape {shape}", request, DELAY))
        typed = add_sub_request()
        _to_contents()(typed)
        cases.append(("add_sub typed", typed, ADD_SUB))

        disagreements = []
        for label, request, schema in cases:
            try:
                validate(request, schema)
                ours = "OK"
            except InvalidRequest as error:
                ours = f"{error.code} ({error})"
            try:
                stub.ModelInfer(request, timeout=30)
                theirs = "OK"
            except grpc.RpcError as error:
                theirs = f"{error.code().name} ({error.details()})"
            if ours != theirs:
                disagreements.append(f"{label}:\n  router {ours}\n  Triton {theirs}")
        assert not disagreements, "\n".join(disagreements)

        # The known differences are still what the module doc says they are.
        for label in sorted(_TRITON_ACCEPTS):
            request = add_sub_request(outputs=("OUTPUT1",))
            next(case[1] for case in BAD_ADD_SUB if case[0] == label)(request)
            rejected(request, ADD_SUB)
            stub.ModelInfer(request, timeout=30)
