"""``meshd.router.validate``: KServe v2 requests checked against Triton model configurations.

Requests are built the way real clients build them (``tritonclient.grpc.InferInput`` +
``set_data_from_numpy`` + the client's own request builder); configs are parsed from the real
``tests/triton_models/*/config.pbtxt``, plus inline configs for the datatypes and shape
features those two models lack. Every bad request must raise :class:`InvalidRequest` naming
the tensor; hypothesis throws arbitrary bytes and structured garbage at :func:`validate`, which
must only ever return a payload size or raise :class:`InvalidRequest`. The last test replays
the add_sub/delay cases against a real Triton: the router must reject what Triton rejects.
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

from meshd.devtriton import TritonServer
from meshd.router.validate import (
    CONTENTS_FIELDS,
    DATATYPES,
    ELEMENT_SIZES,
    InvalidRequest,
    ModelSchema,
    PayloadTooLarge,
    TensorSpec,
    validate,
)

MODELS = Path(__file__).resolve().parent / "triton_models"
Mutation = Callable[[Request], object]


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
    assert error.tensor == "BF16" and "raw_input_contents" in str(error)


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
    assert error.tensor == "R" and "[-1, 2, 2]" in str(error)
    # Optional inputs may be left out; present, they are checked like any other.
    opt = np.zeros((2, 0, 3), dtype=np.int64)
    assert validate(make_request("shapes", {"R": r, "OPT": opt}), SHAPES) == 32
    error = rejected(make_request("shapes", {"R": r, "OPT": np.zeros((2, 1, 2), np.int64)}),
                     SHAPES)
    assert error.tensor == "OPT"
    # Ragged: any length per request; the batch dimension still has to agree.
    for n in (0, 1, 7):
        rag = np.zeros((2, n), dtype=np.float32)
        assert validate(make_request("shapes", {"R": r, "RAG": rag}), SHAPES) == 32 + 8 * n
    error = rejected(make_request("shapes", {"R": r, "RAG": np.zeros((1, 3), np.float32)}),
                     SHAPES)
    assert error.tensor == "RAG" and "batch size 1" in str(error)
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


# (id, mutation of a valid add_sub [1, 4] request, tensor named, fragment of the message)
BAD_ADD_SUB: list[tuple[str, Mutation, str | None, str]] = [
    ("model name", _set("model_name", "add_subb"), None, "model_name 'add_subb'"),
    ("datatype", _set("inputs.0.datatype", "FP64"), "INPUT0",
     "input 'INPUT0': datatype FP64 does not match the model's FP32"),
    ("unknown datatype", _set("inputs.1.datatype", "FLOAT32"), "INPUT1", "FLOAT32"),
    ("lowercase datatype", _set("inputs.1.datatype", "fp32"), "INPUT1", "fp32"),
    ("missing input", _drop_input(1), "INPUT1", "missing"),
    ("unknown input", _add_input("INPUT2"), "INPUT2", "no such input"),
    ("duplicate input", _set("inputs.1.name", "INPUT0"), "INPUT0", "more than once"),
    ("batch too big", _both(_set("inputs.0.shape", [9, 4]), _set("inputs.1.shape", [9, 4])),
     "INPUT0", "batch size 9 is not in 1..8"),
    ("batch 0", _both(_set("inputs.0.shape", [0, 4]), _set("inputs.1.shape", [0, 4])),
     "INPUT0", "batch size 0"),
    ("negative batch", _set("inputs.0.shape", [-1, 4]), "INPUT0", "batch size -1"),
    ("batch mismatch", _set("inputs.1.shape", [2, 2]), "INPUT1", "batch size 2 differs"),
    ("no batch dim", _set("inputs.0.shape", []), "INPUT0", "no batch dimension"),
    ("rank too low", _set("inputs.0.shape", [4]), "INPUT0", "rank 1"),
    ("rank too high", _set("inputs.1.shape", [1, 2, 2]), "INPUT1", "rank 3"),
    ("wildcard in request", _set("inputs.0.shape", [1, -1]), "INPUT0", "negative dimension"),
    ("negative dim", _set("inputs.1.shape", [1, -4]), "INPUT1", "negative dimension"),
    ("raw too short", _raw(0, lambda b: b[:-1]), "INPUT0", "is 15 bytes"),
    ("raw too long", _raw(1, lambda b: b + b"\x00"), "INPUT1", "needs 16"),
    ("shape says more", _set("inputs.0.shape", [1, 5]), "INPUT0", "needs 20"),
    ("raw for one input", lambda r: r.raw_input_contents.pop(), None,
     "raw_input_contents has 1 entries for 2 inputs"),
    ("raw surplus", lambda r: r.raw_input_contents.append(b""), None,
     "raw_input_contents has 3 entries for 2 inputs"),
    ("contents and raw", lambda r: r.inputs[1].contents.fp32_contents.append(1.0), "INPUT1",
     "contents although the request uses raw_input_contents"),
    ("empty contents and raw", lambda r: r.inputs[0].contents.SetInParent(), "INPUT0",
     "contents although"),
    ("no data", _both(_to_contents(), lambda r: r.inputs[1].ClearField("contents")), "INPUT1",
     "no data"),
    ("contents too few", _to_contents(fp32_contents=[1.0] * 3), "INPUT0", "holds 3 elements"),
    ("contents too many", _to_contents(fp32_contents=[1.0] * 5), "INPUT0", "needs 4"),
    ("contents wrong field", _to_contents(int_contents=[1] * 4), "INPUT0",
     "contents.int_contents cannot carry FP32 data, use contents.fp32_contents"),
    ("contents two fields", _to_contents(fp32_contents=[1.0] * 4, fp64_contents=[1.0]),
     "INPUT0", "more than one field"),
    ("contents all empty", _to_contents(bool_contents=[]), "INPUT0", "holds 0 elements"),
    ("unknown output", lambda r: r.outputs.add(name="OUTPUT2"), "OUTPUT2", "no such output"),
    ("shared memory input", _shm("input"), "INPUT1", "shared memory"),
    ("shared memory output", _shm("output"), "OUTPUT0", "shared memory"),
]


@pytest.mark.parametrize("mutate, name, fragment",
                         [case[1:] for case in BAD_ADD_SUB], ids=[case[0] for case in BAD_ADD_SUB])
def test_bad_add_sub_requests_are_rejected_naming_the_tensor(mutate: Mutation, name: str | None,
                                                             fragment: str) -> None:
    request = add_sub_request(outputs=("OUTPUT1",))
    assert validate(request, ADD_SUB) == 32
    mutate(request)
    error = rejected(request, ADD_SUB)
    assert error.tensor == name
    assert fragment in str(error)
    if name is not None:
        assert f"'{name}'" in str(error)


@pytest.mark.parametrize("shape, fragment", [
    ([1, 8], "rank 2, the model expects [-1]"), ([], "rank 0"), ([-1], "negative"),
    ([9], "needs 36"),
])
def test_bad_delay_shapes(shape: list[int], fragment: str) -> None:
    request = delay_request(8)
    request.inputs[0].shape[:] = shape
    error = rejected(request, DELAY)
    assert error.tensor == "PAYLOAD" and fragment in str(error)


@pytest.mark.parametrize("data, fragment", [
    (strings(b"ab"), "holds 1 strings, shape [1, 2] needs 2"),
    (strings(b"ab", b"c", b"d"), "more than the 2 strings"),
    (b"", "holds 0 strings"),
    (strings(b"ab", b"cd")[:-1], "ends inside string 2"),
    (strings(b"ab", b"cd") + b"\x00", "ends inside the 4-byte length of string 3"),
    (strings(b"ab") + b"\x07\x00", "ends inside the 4-byte length of string 2"),
    (strings(b"ab") + struct.pack("<I", 0xFFFFFFFF), "ends inside string 2"),
])
def test_bad_string_data(data: bytes, fragment: str) -> None:
    request = strings_request([[b"ab", b"cd"]])
    assert validate(request, STRINGS) == 12 + 8
    request.raw_input_contents[0] = data
    error = rejected(request, STRINGS)
    assert error.tensor == "TEXT" and fragment in str(error)


def test_bad_typed_string_count() -> None:
    typed = Request(model_name="strings")
    typed.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 2]).contents.bytes_contents \
        .extend([b"a", b"b", b"c"])
    typed.inputs.add(name="IDS", datatype="INT32", shape=[1, 2]).contents.int_contents \
        .extend([1, 2])
    error = rejected(typed, STRINGS)
    assert error.tensor == "TEXT" and "holds 3 elements" in str(error)


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
    assert f"input '{datatype}': datatype {wrong} does not match the model's {datatype}" == str(
        error)


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


# --------------------------------------------------------------------------- fuzzing

FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _check_outcome(request: Request, schema: ModelSchema) -> int | InvalidRequest:
    """validate's result, which must be a payload size or an InvalidRequest - nothing else."""
    try:
        payload = validate(request, schema, max_bytes=1 << 16)
    except InvalidRequest as error:
        assert str(error)
        if error.tensor is not None:
            assert f"'{error.tensor[:128]}" in str(error)
        return error
    assert isinstance(payload, int) and 0 <= payload <= 1 << 16
    if request.raw_input_contents:
        assert payload == sum(len(raw) for raw in request.raw_input_contents)
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

# Cases left out of the comparison, where the router knowingly differs: Triton 2.51 ignores
# surplus raw entries, and takes a batch of 0 as no batch dimension (so [0, 4] with 4 elements
# passes); the router refuses both. An unregistered shared-memory region fails in Triton as
# NOT_FOUND rather than INVALID_ARGUMENT. A wrong model name is a different model to Triton.
_NOT_COMPARED = {"model name", "raw surplus", "batch 0", "shared memory input",
                 "shared memory output"}


def test_router_rejects_what_triton_rejects(triton_server: TritonServer) -> None:
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
                ours = f"INVALID_ARGUMENT ({error})"
            try:
                stub.ModelInfer(request, timeout=30)
                theirs = "OK"
            except grpc.RpcError as error:
                theirs = f"{error.code().name} ({error.details()})"
            if ours.split()[0] != theirs.split()[0]:
                disagreements.append(f"{label}: router {ours} / Triton {theirs}")
        assert not disagreements, "\n".join(disagreements)

        # The known differences are still what the module doc says they are.
        for label in ("raw surplus", "batch 0"):
            request = add_sub_request(outputs=("OUTPUT1",))
            next(case[1] for case in BAD_ADD_SUB if case[0] == label)(request)
            rejected(request, ADD_SUB)
            stub.ModelInfer(request, timeout=30)
