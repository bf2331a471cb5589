"""Triton's semantics through the router, over gRPC: each call made directly to a real Triton and
through a router in front of two of them gives the same result or the same error.

Statistics are the sum over the replicas; the server metadata is the fleet's Triton with the
extensions the router serves; an unknown model is NOT_FOUND in Triton's words; explicit tensor
contents work; system shared memory works for a client on the router's host; what acts on one
server (CUDA shared memory, repository control) is UNIMPLEMENTED, saying why.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tc
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from meshd.dev.triton import TritonServer
from tests.test_router import RouterHarness, add_sub


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RouterHarness,
                                                                      list[TritonServer]]]:
    from tests.triton import TritonFactory
    factory = TritonFactory(tmp_path_factory.mktemp("tritons"))
    try:
        servers = factory(2)
        h = RouterHarness(servers)
        try:
            yield h, servers
        finally:
            h.close()
    finally:
        factory.close()


def _error(call: Any) -> tuple[str, str]:
    try:
        call()
    except InferenceServerException as exc:
        return str(exc.status()), exc.message()
    raise AssertionError("no error")


def test_unknown_models_are_not_found_in_tritons_words(fleet: Any) -> None:
    h, servers = fleet
    via, direct = tc.InferenceServerClient(h.addr), tc.InferenceServerClient(servers[0].grpc_url)
    for call in (lambda c: c.get_model_metadata("nope"), lambda c: c.get_model_config("nope"),
                 lambda c: c.infer("nope", []),
                 lambda c: c.get_model_metadata("add_sub", model_version="7"),
                 lambda c: add_sub(c, 4, model_version="7"),
                 lambda c: c.get_inference_statistics("nope")):
        assert _error(lambda: call(via)) == _error(lambda: call(direct))  # noqa: B023
    assert _error(lambda: via.infer("nope", [])) == (
        "StatusCode.NOT_FOUND", "Request for unknown model: 'nope' is not found")
    assert via.is_model_ready("nope") == direct.is_model_ready("nope") is False


def test_statistics_are_the_sum_over_the_replicas(fleet: Any) -> None:
    h, servers = fleet
    via = tc.InferenceServerClient(h.addr)
    for _ in range(12):
        add_sub(via, 4)
    deadline = time.monotonic() + 10
    while True:  # Triton books a request's statistics just after answering it: let them settle
        parts = [tc.InferenceServerClient(s.grpc_url).get_inference_statistics(
            "add_sub", as_json=True)["model_stats"][0] for s in servers]
        total = via.get_inference_statistics("add_sub", as_json=True)
        again = [tc.InferenceServerClient(s.grpc_url).get_inference_statistics(
            "add_sub", as_json=True)["model_stats"][0] for s in servers]
        if parts == again or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(total["model_stats"]) == 1
    got = total["model_stats"][0]
    assert (got["name"], got["version"]) == ("add_sub", "1")
    for field in ("inference_count", "execution_count"):
        assert int(got.get(field, 0)) == sum(int(p.get(field, 0)) for p in parts)
    success = got["inference_stats"]["success"]
    assert int(success["count"]) == sum(int(p["inference_stats"]["success"].get("count", 0))
                                        for p in parts) >= 12
    assert int(success["ns"]) == sum(int(p["inference_stats"]["success"].get("ns", 0))
                                     for p in parts)
    assert int(got["last_inference"]) == max(int(p.get("last_inference", 0)) for p in parts)
    every = via.get_inference_statistics(as_json=True)["model_stats"]
    assert [(m["name"], m["version"]) for m in every] == [("add_sub", "1"), ("delay", "1")]
    # Triton's own error for a model it does not have.
    direct = tc.InferenceServerClient(servers[0].grpc_url)
    assert _error(lambda: via.get_inference_statistics("nope")) == _error(
        lambda: direct.get_inference_statistics("nope"))


def test_server_metadata_is_the_fleets_triton(fleet: Any) -> None:
    h, servers = fleet
    via = tc.InferenceServerClient(h.addr).get_server_metadata(as_json=True)
    each = [tc.InferenceServerClient(s.grpc_url).get_server_metadata(as_json=True)
            for s in servers]
    one = each[0]
    # A fleet's servers share a name ("triton" by default); these test servers have their own.
    assert (via["name"], via["version"]) in {(m["name"], m["version"]) for m in each}
    assert set(via["extensions"]) <= set(one["extensions"])
    assert {"sequence", "statistics", "system_shared_memory", "binary_tensor_data"} <= set(
        via["extensions"])
    assert "cuda_shared_memory" not in via["extensions"]
    assert "model_repository" not in via["extensions"]


def test_explicit_contents_pass_and_mixing_them_with_raw_is_refused_as_triton_does(
        fleet: Any) -> None:
    h, servers = fleet
    stubs = [service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(a))
             for a in (h.addr, servers[0].grpc_url)]
    req = service_pb2.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        t = req.inputs.add(name=name, datatype="FP32", shape=[1, 3])
        t.contents.fp32_contents.extend([1.0, 2.0, 3.0])
    got = [s.ModelInfer(req, timeout=10) for s in stubs]
    assert got[0].raw_output_contents == got[1].raw_output_contents
    mixed = service_pb2.ModelInferRequest()
    mixed.CopyFrom(req)
    mixed.inputs[1].ClearField("contents")
    mixed.raw_input_contents.append(np.zeros(3, np.float32).tobytes())
    errors = []
    for s in stubs:
        with pytest.raises(grpc.RpcError) as err:
            s.ModelInfer(mixed, timeout=10)
        errors.append((err.value.code(), err.value.details()))
    assert errors[0] == errors[1], errors
    assert "contents field must not be specified" in errors[0][1]


def _shm_round(addr: str, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """add_sub with its inputs and outputs in shared memory, through ``addr``; the outputs."""
    client = tc.InferenceServerClient(addr)
    client.unregister_system_shared_memory()
    tag = addr.replace(".", "_").replace(":", "_")
    hin = shm.create_shared_memory_region(f"in{tag}", f"/meshd_in_{tag}", 128)
    hout = shm.create_shared_memory_region(f"out{tag}", f"/meshd_out_{tag}", 128)
    try:
        shm.set_shared_memory_region(hin, [a, b])
        client.register_system_shared_memory("input", f"/meshd_in_{tag}", 128)
        client.register_system_shared_memory("output", f"/meshd_out_{tag}", 128)
        status = client.get_system_shared_memory_status(as_json=True)
        assert {r["name"] for r in status["regions"].values()} == {"input", "output"}
        assert _error(lambda: client.register_system_shared_memory(
            "input", f"/meshd_in_{tag}", 128)) == (
            "StatusCode.ALREADY_EXISTS", "shared memory region 'input' already in manager")
        inputs = [tc.InferInput("INPUT0", [1, 16], "FP32"),
                  tc.InferInput("INPUT1", [1, 16], "FP32")]
        inputs[0].set_shared_memory("input", 64)
        inputs[1].set_shared_memory("input", 64, offset=64)
        outputs = [tc.InferRequestedOutput("OUTPUT0"), tc.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("output", 64)
        outputs[1].set_shared_memory("output", 64, offset=64)
        result = client.infer("add_sub", inputs, outputs=outputs)
        # In the region: the reply carries an empty entry for each, as Triton's does.
        assert list(result.get_response().raw_output_contents) == [b"", b""]
        got = (shm.get_contents_as_numpy(hout, np.float32, [1, 16]).copy(),
               shm.get_contents_as_numpy(hout, np.float32, [1, 16], offset=64).copy())
        small = tc.InferRequestedOutput("OUTPUT0")
        small.set_shared_memory("output", 8)
        assert _error(lambda: client.infer("add_sub", inputs, outputs=[small]))[0] == \
            "StatusCode.INTERNAL"
        client.unregister_system_shared_memory("input")
        assert _error(lambda: client.get_system_shared_memory_status("input")) == (
            "StatusCode.NOT_FOUND", "Unable to find system shared memory region: 'input'")
        assert _error(lambda: client.infer("add_sub", inputs))[0] == "StatusCode.NOT_FOUND"
        assert _error(lambda: client.register_system_shared_memory(
            "bad", "/meshd-no-such-key", 64)) == (
            "StatusCode.INTERNAL", "Unable to open shared memory region: '/meshd-no-such-key'")
        client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status(as_json=True) == {}
        return got
    finally:
        shm.destroy_shared_memory_region(hin)
        shm.destroy_shared_memory_region(hout)


def test_system_shared_memory_through_a_router_on_the_clients_host(fleet: Any) -> None:
    h, servers = fleet
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.float32)
    direct, via = (_shm_round(addr, a, b) for addr in (servers[0].grpc_url, h.addr))
    # Every request ends exactly once, a region the router refused included.
    c = h.router.counters
    assert c.failed.get("NOT_FOUND", 0) >= 1
    assert c.requests == (c.completed + c.invalid + c.cancelled + sum(c.failed.values())
                          + sum(c.shed.values()))
    np.testing.assert_array_equal(direct[0], a + b)
    np.testing.assert_array_equal(via[0], a + b)
    np.testing.assert_array_equal(via[1], a - b)


def test_what_acts_on_one_server_is_unimplemented_saying_why(fleet: Any) -> None:
    h, _ = fleet
    via = tc.InferenceServerClient(h.addr)
    code, message = _error(lambda: via.register_cuda_shared_memory("r", b"aGFuZGxl", 0, 64))
    assert code == "StatusCode.UNIMPLEMENTED" and "device memory" in message
    # None registered: nothing to list or unregister, as a server without any answers.
    assert via.get_cuda_shared_memory_status(as_json=True) == {}
    via.unregister_cuda_shared_memory()
    assert _error(lambda: via.get_cuda_shared_memory_status("r")) == (
        "StatusCode.NOT_FOUND", "Unable to find cuda shared memory region: 'r'")
    # A version string that is none: Triton's words.
    direct = tc.InferenceServerClient(fleet[1][0].grpc_url)
    for version in ("wrong_specification", "-1"):
        assert _error(lambda: via.get_model_metadata("add_sub", version)) == _error(  # noqa: B023
            lambda: direct.get_model_metadata("add_sub", version))  # noqa: B023
    code, message = _error(lambda: via.load_model("add_sub"))
    assert code == "StatusCode.UNIMPLEMENTED" and "model placement" in message
