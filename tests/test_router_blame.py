"""Whose fault an error is (meshd/router/blame.py), on the words real Tritons and their
backends use: a replica's faults fail over, a request's go back to the client."""

from __future__ import annotations

import json

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshd.router.blame import replica_fault, replica_fault_http

C = grpc.StatusCode

REQUEST = [
    (C.INTERNAL, "INPUT0 shape (1, 4) != INPUT1 shape (1, 16)"),  # add_sub's error response
    (C.INTERNAL, "Failed to process the request(s) for model instance 'outlier_0', message: "
                 "TritonModelException: Outlier. Input sums to greater than 100"),
    (C.INTERNAL, "Failed to process the request(s) for model instance 'pre_0', message: "
                 "UnidentifiedImageError: cannot identify image file"),
    (C.INTERNAL, "onnx runtime error 2: Got invalid dimensions for input: x for the "
                 "following indices index: 1 Got: 3 Expected: 4"),
    (C.INVALID_ARGUMENT, "[request id: <id_unknown>] input 'INPUT0' batch size does not match "
                         "other inputs for 'add_sub'"),
    (C.NOT_FOUND, "Request for unknown model: 'x' is not found"),
    (C.UNIMPLEMENTED, "not supported"),
    (C.DEADLINE_EXCEEDED, "Deadline Exceeded"),
    (C.CANCELLED, "cancelled"),
]
REPLICA = [
    (C.UNAVAILABLE, "failed to connect to all addresses"),
    (C.RESOURCE_EXHAUSTED, "the replica shed the request"),
    (C.UNKNOWN, "Stream removed"),
    (C.INTERNAL, "Failed to process the request(s) for model 'delay_0_0', message: "
                 "TritonModelException: delay: injected failure (behaviour fail=true): "
                 "model instance unhealthy"),
    (C.INTERNAL, "Stub process 'add_sub_0_0' is not healthy."),
    (C.INTERNAL, "Failed to process the request(s) for model 'marian', message: "
                 "RuntimeError: CUDA failed with error out of memory"),
    (C.INTERNAL, "Failed to process the request(s) for model instance 'pre_0', message: "
                 "Failed to increase the shared memory pool size for key 'triton_python_"
                 "backend_shm_region_6' to 67108864 bytes."),
    (C.INTERNAL, "Model 'undefined_model' is not ready."),
    (C.INTERNAL, "Server is shutting down"),
]


@pytest.mark.parametrize(("code", "details"), REQUEST)
def test_the_requests_own_faults_go_back_to_the_client(code: grpc.StatusCode,
                                                       details: str) -> None:
    assert not replica_fault(code, details)


@pytest.mark.parametrize(("code", "details"), REPLICA)
def test_a_replicas_faults_fail_over(code: grpc.StatusCode, details: str) -> None:
    assert replica_fault(code, details)


def test_http_answers_are_judged_by_status_and_tritons_error_words() -> None:
    def body(text: str) -> bytes:
        return json.dumps({"error": text}).encode()

    assert replica_fault_http(503, b"") and replica_fault_http(429, b"")
    assert not replica_fault_http(400, body("model is not ready"))  # 400: the request's
    assert not replica_fault_http(500, body(REQUEST[0][1]))
    assert replica_fault_http(500, body(REPLICA[4][1]))
    assert not replica_fault_http(500, b"\xff\xfe not json")


@given(st.sampled_from(list(C)), st.text(max_size=200))
def test_codes_other_than_internal_never_depend_on_the_words(code: grpc.StatusCode,
                                                              details: str) -> None:
    if code != C.INTERNAL:
        assert replica_fault(code, details) == (code in (C.UNAVAILABLE, C.RESOURCE_EXHAUSTED,
                                                         C.UNKNOWN))
