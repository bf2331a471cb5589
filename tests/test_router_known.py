"""``meshd.router.known``: requests recognised by their bytes, so that the router parses and
validates each request shape once.

The key must be exact: two requests share one only when everything but their tensor bytes
is equal (the header bytes, the tensors' lengths).  Hypothesis builds requests the way
protobuf serializes them and checks the key against the message itself; arbitrary bytes must
give a key or None, never an exception.  Through a real router over real Tritons: a
repeated request is recognised and answered right, while a request with the same header but
a wrong tensor length, a sequence's request or a BYTES model's request still goes through
validation."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2
from tritonclient.grpc._utils import _get_inference_request
from tritonclient.utils import InferenceServerException

from meshd.router.known import Known, KnownRequests, grpc_key
from meshd.router.validate import ModelSchema, TensorSpec

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@st.composite
def requests(draw: Any) -> service_pb2.ModelInferRequest:
    req = service_pb2.ModelInferRequest(model_name=draw(names), model_version=draw(names),
                                        id=draw(names))
    for key in draw(st.lists(names, max_size=3)):
        req.parameters[key].int64_param = draw(st.integers(-2**63, 2**63 - 1))
    n = draw(st.integers(0, 4))
    for _ in range(n):
        t = req.inputs.add(name=draw(names), datatype=draw(st.sampled_from(["FP32", "INT8"])))
        t.shape.extend(draw(st.lists(st.integers(-1, 1 << 40), max_size=4)))
    for name in draw(st.lists(names, max_size=2)):
        req.outputs.add(name=name)
    if draw(st.booleans()):
        for _ in range(n):
            req.raw_input_contents.append(draw(st.binary(max_size=300)))
    return req


@given(requests())
@settings(max_examples=300, deadline=None)
def test_the_key_is_the_header_and_the_tensor_lengths(req: service_pb2.ModelInferRequest
                                                      ) -> None:
    raw = req.SerializeToString()
    key = grpc_key(raw)
    if not req.raw_input_contents:
        assert key is None  # the data is in the header, or there is none: nothing to share
        return
    header = service_pb2.ModelInferRequest()
    header.CopyFrom(req)
    header.ClearField("raw_input_contents")
    if len(header.SerializeToString()) > 4096:
        assert key is None
        return
    assert key is not None
    # (Map entries serialize in no fixed order: compared as messages.)
    assert service_pb2.ModelInferRequest.FromString(key[0]) == header
    assert key[1] == tuple(len(r) for r in req.raw_input_contents)


@given(requests(), st.data())
@settings(max_examples=200, deadline=None)
def test_only_the_tensor_bytes_may_differ_under_one_key(req: service_pb2.ModelInferRequest,
                                                        data: Any) -> None:
    other = service_pb2.ModelInferRequest()
    other.CopyFrom(req)
    for i, blob in enumerate(req.raw_input_contents):
        other.raw_input_contents[i] = data.draw(st.binary(min_size=len(blob),
                                                          max_size=len(blob)))
    req.ClearField("parameters")  # (map entries serialize in no fixed order)
    other.ClearField("parameters")
    assert grpc_key(other.SerializeToString()) == grpc_key(req.SerializeToString())
    if req.raw_input_contents:
        other.raw_input_contents[0] += b"x"  # one byte longer: another key
        assert grpc_key(other.SerializeToString()) != grpc_key(req.SerializeToString())


@given(st.binary(max_size=600))
@settings(max_examples=500, deadline=None)
def test_arbitrary_bytes_give_a_key_or_none(raw: bytes) -> None:
    key = grpc_key(raw)
    if key is not None:
        header, lengths = key
        assert raw.startswith(header)
        assert sum(lengths) < len(raw) - len(header) + 1


def test_tensors_before_the_header_have_no_key() -> None:
    req = service_pb2.ModelInferRequest(model_name="m", raw_input_contents=[b"\0" * 4])
    req.inputs.add(name="x", datatype="FP32", shape=[1])
    tensors = service_pb2.ModelInferRequest(raw_input_contents=[b"\0" * 4])
    header = service_pb2.ModelInferRequest(model_name="m")
    header.inputs.add(name="x", datatype="FP32", shape=[1])
    # The same message with its fields out of the usual order: valid protobuf, no key.
    raw = tensors.SerializeToString() + header.SerializeToString()
    assert service_pb2.ModelInferRequest.FromString(raw) == req
    assert grpc_key(raw) is None
    assert grpc_key(req.SerializeToString()) is not None
    # A field the router does not know (99), or a non-length-delimited wire type: no key.
    assert grpc_key(req.SerializeToString() + b"\x98\x06\x01") is None
    assert grpc_key(b"\x08\x01" + req.SerializeToString()) is None


def test_the_table_is_bounded_oldest_first() -> None:
    schema = ModelSchema("m", 0, {"x": TensorSpec("x", "FP32", (1,))}, frozenset())
    table = KnownRequests(size=2)
    for i in range(3):
        table.put(i, Known("m", "", i, schema))
    assert len(table) == 2 and table.get(0) is None and table.get(2) is not None
    table.put(1, Known("m", "", 10, schema))  # a key already there replaces, drops nothing
    assert len(table) == 2 and table.get(1).payload == 10  # type: ignore[union-attr]


def test_bytes_models_are_not_data_free() -> None:
    fixed = ModelSchema("m", 0, {"x": TensorSpec("x", "FP32", (1,))}, frozenset())
    strings = ModelSchema("m", 0, {"x": TensorSpec("x", "FP32", (1,)),
                                   "s": TensorSpec("s", "BYTES", (1,))}, frozenset())
    assert fixed.data_free and not strings.data_free


# --- through a router over real Tritons ----------------------------------------------------

@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.test_router import RouterHarness
    from tests.triton import TritonFactory
    factory = TritonFactory(tmp_path_factory.mktemp("tritons"))
    try:
        h = RouterHarness(factory(2))
        try:
            yield h
        finally:
            h.close()
    finally:
        factory.close()


def _inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    out = []
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        x = grpcclient.InferInput(name, list(arr.shape), "FP32")
        x.set_data_from_numpy(arr)
        out.append(x)
    return out


def test_a_repeated_request_is_recognised_and_answered_right(fleet: Any) -> None:
    gw = fleet.router
    client = grpcclient.InferenceServerClient(fleet.addr)
    try:
        before = len(gw.known)
        for i in range(5):
            a = np.full((1, 16), i, np.float32)
            b = np.arange(16, dtype=np.float32).reshape(1, 16)
            res = client.infer("add_sub", _inputs(a, b))
            np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)
        assert len(gw.known) == before + 1
        # Same header, one tensor a float short: a new key, validated, refused in Triton's
        # words - and not remembered.
        req = _get_inference_request(
            model_name="add_sub", inputs=_inputs(np.ones((1, 16), np.float32),
                                                 np.ones((1, 16), np.float32)),
            model_version="", request_id="", outputs=None, sequence_id=0,
            sequence_start=False, sequence_end=False, priority=0, timeout=None,
            parameters=None)
        req.raw_input_contents[1] = req.raw_input_contents[1][:-4]
        channel = grpc.insecure_channel(fleet.addr)
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as err:
            call(req.SerializeToString())
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "INPUT1" in (err.value.details() or "")
        channel.close()
        assert len(gw.known) == before + 1
        # A sequence's requests are never remembered (their ids make every header new).
        try:
            client.infer("add_sub", _inputs(np.ones((1, 16), np.float32),
                                            np.ones((1, 16), np.float32)),
                         sequence_id=7, sequence_start=True)
        except InferenceServerException:
            pass  # whatever Triton makes of a sequence for a model without a sequence batcher
        assert len(gw.known) == before + 1
    finally:
        client.close()


@given(requests(), requests())
@settings(max_examples=300, deadline=None)
def test_a_guessed_layout_finds_only_what_the_walk_would(first: service_pb2.ModelInferRequest,
                                                         second: service_pb2.ModelInferRequest
                                                         ) -> None:
    """Whatever was recognised before, a request's key and what is found under it are what
    walking it gives: the layout guessed from an earlier request of the same length only
    saves the walk."""
    schema = ModelSchema("m", 0, {"x": TensorSpec("x", "FP32", (1,))}, frozenset())
    table = KnownRequests()
    a, b = first.SerializeToString(), second.SerializeToString()
    key_a, _ = table.key(a)
    if key_a is not None:
        table.put(key_a, Known("m", "", 1, schema))
    key_b, known_b = table.key(b)
    assert key_b == grpc_key(b)
    assert known_b is (table.get(key_b) if key_b is not None else None)
    # The same request again (its layout now remembered) finds the same.
    assert table.key(b) == (key_b, known_b)


def test_a_header_that_only_looks_like_tensors_is_not_mistaken() -> None:
    """Two messages of one length whose bytes at the remembered offset parse as the same
    tensor records, while the second's header differs there: no false hit."""
    schema = ModelSchema("m", 0, {"x": TensorSpec("x", "FP32", (1,))}, frozenset())
    req = service_pb2.ModelInferRequest(model_name="m", raw_input_contents=[b"abcd"])
    req.inputs.add(name="x", datatype="FP32", shape=[1])
    raw = req.SerializeToString()
    table = KnownRequests()
    key, known = table.key(raw)
    assert key is not None and known is None
    table.put(key, Known("m", "", 4, schema))
    assert table.key(raw)[1] is not None
    # Same length, other tensor bytes: found; a header byte changed: not found.
    assert table.key(raw[:-4] + b"wxyz")[1] is not None
    changed = bytearray(raw)
    changed[3] ^= 1  # inside the model name
    assert table.key(bytes(changed))[1] is None
