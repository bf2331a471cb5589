"""The router's HTTP/REST ingress against real Triton servers: every call made through the
router's HTTP port gets what the same call gets from Triton's own HTTP port - status, the
headers that matter, the JSON (or binary) body, the error message - whether it is made with
tritonclient.http, tritonclient.http.aio or a plain HTTP request (as curl would make it).

The router runs in-process (``tests.test_router.RouterHarness``, its gRPC ingress and gateway)
with ``serve_http`` on its loop, both ways it can reach Triton: forwarding requests as they
came to the replicas' HTTP ports (``meshd.router.http_dispatch``), and converting them to gRPC
(replicas that advertise no HTTP address).  Sequences go over gRPC either way.  Where the
router answers differently on purpose it is said at the case: a malformed body is 400 where
Triton says 500 (with Triton's message), and what a router cannot do for one server (CUDA
shared memory, repository control, trace and log settings) is 501.

The Triton servers are shared by the module (``tests.triton.TritonFactory``, the machinery of
the ``triton_factory`` fixture): the ``add_sub`` and ``delay`` models, the ``accumulate``
sequence models, and - when ``tests/triton_examples`` is there - ``simple_identity`` (BYTES)
and ``repeat_int32`` (decoupled).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gzip
import http.client
import json
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as th
import tritonclient.http.aio as tha
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.utils import InferenceServerException

from certs import tls
from certs.ca import CertificateAuthority
from certs.spiffe import SpiffeId
from meshd.dev.ports import free_port
from meshd.dev.triton import TritonServer
from meshd.router import http_tensors
from meshd.router import server as router_server
from meshd.router.auth import ClientAuth, load_tokens, token_hash
from meshd.router.gateway import Gateway
from meshd.router.scoring import LocalScoring
from meshd.score.limiter import LimiterConfig
from meshd.score.scorer import Scorer
from meshd.signals.fused import FusedState
from tests.test_router import RouterHarness, until
from tests.triton import MODEL_REPO, TritonFactory, require_triton

ROOT = Path(__file__).resolve().parent
SEQUENCES = ROOT / "triton_sequences"
EXAMPLES = ROOT / "triton_examples"
BYTES_MODEL = "simple_identity"
DECOUPLED_MODEL = "repeat_int32"


def _available(model: str) -> bool:
    return (EXAMPLES / model / "config.pbtxt").is_file()


@pytest.fixture(scope="module")
def tritons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[TritonServer]]:
    require_triton()
    repo = tmp_path_factory.mktemp("repo")
    for model in ("add_sub", "delay"):
        (repo / model).symlink_to(MODEL_REPO / model)
    for model in ("accumulate", "accumulate_str"):
        (repo / model).symlink_to(SEQUENCES / model)
    for model in (BYTES_MODEL, DECOUPLED_MODEL):
        if _available(model):
            (repo / model).symlink_to(EXAMPLES / model)
    factory = TritonFactory(tmp_path_factory.mktemp("tritons"))
    try:
        yield factory(2, repo=repo)
    finally:
        factory.close()


def _models(servers: list[TritonServer]) -> tuple[str, ...]:
    return tuple(p.name for p in sorted(servers[0].repo.iterdir()))


@dataclass
class HttpRouter:
    harness: RouterHarness
    runner: Any
    url: str

    def serve(self, auth: ClientAuth, ssl_context: Any = None) -> str:
        """Another HTTP port on the same gateway (its URL)."""
        runner, addr = self.harness.call(router_server.serve_http(
            self.harness.router, ("127.0.0.1", 0), ssl_context=ssl_context, auth=auth))
        self.extra.append(runner)
        return f"http://{addr}"

    def __post_init__(self) -> None:
        self.extra: list[Any] = []

    def close(self) -> None:
        for runner in [self.runner, *self.extra]:
            self.harness.call(runner.cleanup())
        self.harness.close()


def _start(servers: list[TritonServer], **kw: Any) -> HttpRouter:
    h = RouterHarness(servers, models=_models(servers), **kw)
    runner, addr = h.call(router_server.serve_http(h.router, ("127.0.0.1", 0),
                                                   ssl_context=None))
    assert addr.startswith("127.0.0.1:") and int(addr.rsplit(":", 1)[1]) > 0
    return HttpRouter(h, runner, f"http://{addr}")


@pytest.fixture(params=["forward", "convert"])
def router(request: pytest.FixtureRequest, tritons: list[TritonServer]) -> Iterator[HttpRouter]:
    """The router both ways: forwarding to the replicas' own HTTP ports (they advertise
    them), and converting to gRPC (they do not)."""
    r = _start(tritons, http=request.param == "forward")
    try:
        yield r
    finally:
        r.close()


# --- plain HTTP --------------------------------------------------------------------------------

@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def content_type(self) -> str | None:
        return self.headers.get("content-type")

    def json(self) -> Any:
        head = self.headers.get("inference-header-content-length")
        text = self.body[:int(head)] if head else self.body
        return json.loads(text.decode("utf-8", "surrogateescape"))  # BYTES may be any bytes

    def binary(self) -> bytes:
        head = self.headers.get("inference-header-content-length")
        return self.body[int(head):] if head else b""


def fetch(base: str, method: str, path: str, body: Any = None,
          headers: dict[str, str] | None = None, timeout: float = 30,
          context: Any = None) -> Answer:
    """One request the way curl makes it (urllib, a connection of its own)."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            status, got, data = resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        status, got, data = err.code, err.headers, err.read()
    return Answer(status, {k.lower(): v for k, v in got.items()}, data)


def same(triton: TritonServer, r: HttpRouter, method: str, path: str, body: Any = None,
         headers: dict[str, str] | None = None, *, triton_status: int | None = None) -> Answer:
    """The call to Triton and through the router: the same status, Content-Type,
    Inference-Header-Content-Length and body (JSON compared parsed, binary data byte for
    byte).  ``triton_status``: the status Triton gives where the router gives 400 on purpose
    (a malformed body)."""
    want = fetch(triton.http_url, method, path, body, headers)
    got = fetch(r.url, method, path, body, headers)
    where = f"{method} {path} {body!r:.200}"
    if triton_status is None:
        assert got.status == want.status, (where, want, got)
    else:
        assert (want.status, got.status) == (triton_status, 400), (where, want, got)
    assert got.content_type == want.content_type, (where, want, got)
    head = "inference-header-content-length"
    assert got.headers.get(head) == want.headers.get(head), (where, want, got)
    if want.body[:1] in (b"{", b"["):
        assert got.json() == want.json(), where
        assert got.binary() == want.binary(), where
    else:
        assert got.body == want.body, (where, want, got)
    return got


ADD_SUB = {"inputs": [
    {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]},
    {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": [[1, 1, 1, 1]]}]}


def add_sub(**extra: Any) -> dict[str, Any]:
    return {**json.loads(json.dumps(ADD_SUB)), **extra}


def binary_body(doc: dict[str, Any], *blobs: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(doc).encode()
    return head + b"".join(blobs), {"Inference-Header-Content-Length": str(len(head))}


def strings(*values: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


# --- endpoints ---------------------------------------------------------------------------------

def _shape(doc: Any) -> Any:
    """A JSON document's structure: keys, and the types of the values (a list's: its first
    element's; an empty list's: none)."""
    if isinstance(doc, dict):
        return {k: _shape(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_shape(v) for v in doc[:1]]
    return type(doc).__name__


def same_shape(got: Any, want: Any) -> bool:
    """Whether two documents have one structure, where an empty list fits any list (the
    counts, batch sizes and memory of two fleets differ)."""
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(same_shape(got[k], want[k]) for k in got)
    if isinstance(got, list) and isinstance(want, list):
        return all(same_shape(a, b) for a in got for b in want[:1]) and \
            all(same_shape(a, b) for a in got[:1] for b in want)
    return type(got) is type(want)


def test_health_metadata_config_index_and_stats_match_triton(
        router: HttpRouter, tritons: list[TritonServer]) -> None:
    t = tritons[0]
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/add_sub/ready",
                 "/v2/models/add_sub/versions/1/ready", "/v2/models/nope/ready",
                 "/v2/models/add_sub/versions/3/ready", "/v2/models/add_sub",
                 "/v2/models/add_sub/versions/1", "/v2/models/add_sub/versions/2",
                 "/v2/models/nope", "/v2/models/add%5Fsub", "/v2/models/nope/config",
                 "/v2/models/nope/stats", "/v2/nothing", "/v2/", "/v2/models",
                 "/v2/models/add_sub/versions/x", "/v2/models/add_sub/versions/1/trace/setting",
                 "/v2/models/add_sub?x=1"):
        same(t, router, "GET", path)
    for model in _models(tritons):
        same(t, router, "GET", f"/v2/models/{model}/config")
        same(t, router, "GET", f"/v2/models/{model}/versions/1/config")
    for method, path in (("POST", "/v2/health/live"), ("HEAD", "/v2/health/ready"),
                         ("POST", "/v2/models/add_sub"), ("POST", "/v2/models/add_sub/config"),
                         ("PUT", "/v2/models/add_sub/ready"), ("POST", "/v2"),
                         ("POST", "/v2/models/stats"), ("GET", "/v2/repository/index"),
                         ("GET", "/v2/models/add_sub/infer"),
                         ("GET", "/v2/models/add_sub/generate"),
                         ("POST", "/v2/systemsharedmemory/status"),
                         ("GET", "/v2/repository/models/add_sub/load")):
        same(t, router, method, path)
    same(t, router, "POST", "/v2/repository/index")
    same(t, router, "POST", "/v2/repository/index", {"ready": True})
    same(t, router, "POST", "/v2/repository/index", b"{bad", triton_status=500)
    # Server metadata: the fleet's Triton, with the extensions the router serves.
    want, got = fetch(t.http_url, "GET", "/v2"), fetch(router.url, "GET", "/v2")
    assert got.status == 200 and got.content_type == want.content_type == "application/json"
    assert (got.json()["name"], got.json()["version"]) == (want.json()["name"],
                                                           want.json()["version"])
    assert {"binary_tensor_data", "classification", "sequence"} <= set(got.json()["extensions"])
    assert set(got.json()["extensions"]) <= set(want.json()["extensions"])
    assert "cuda_shared_memory" not in got.json()["extensions"]
    # Statistics: Triton's structure (the counts are the fleet's).
    fetch(router.url, "POST", "/v2/models/add_sub/infer", add_sub())
    for path in ("/v2/models/stats", "/v2/models/add_sub/stats",
                 "/v2/models/add_sub/versions/1/stats", "/v2/models/delay/stats"):
        want, got = fetch(t.http_url, "GET", path), fetch(router.url, "GET", path)
        assert (got.status, got.content_type) == (want.status, want.content_type) == \
            (200, "application/json"), path
        assert same_shape(got.json(), want.json()), (path, _shape(got.json()),
                                                     _shape(want.json()))
    stats = fetch(router.url, "GET", "/v2/models/add_sub/stats").json()["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] >= 1
    assert sorted(m["name"] for m in fetch(router.url, "GET", "/v2/models/stats").json()[
        "model_stats"]) == sorted(_models(tritons))


def test_stats_of_an_unknown_version_match_triton(router: HttpRouter,
                                                  tritons: list[TritonServer]) -> None:
    same(tritons[0], router, "GET", "/v2/models/add_sub/versions/2/stats")


def test_tritonclient_http_gets_what_it_gets_directly(router: HttpRouter,
                                                      tritons: list[TritonServer]) -> None:
    """The sync client (geventhttpclient) and the asyncio one (aiohttp) against both."""
    direct = th.InferenceServerClient(tritons[0].http_url[len("http://"):])
    via = th.InferenceServerClient(router.url[len("http://"):])
    assert via.is_server_live() and via.is_server_ready()
    assert via.is_model_ready("add_sub") and not via.is_model_ready("nope")
    for model in ("add_sub", "delay"):
        assert via.get_model_metadata(model) == direct.get_model_metadata(model)
        assert via.get_model_config(model) == direct.get_model_config(model)
    assert via.get_model_repository_index() == direct.get_model_repository_index()
    assert same_shape(via.get_inference_statistics("add_sub"),
                      direct.get_inference_statistics("add_sub"))
    meta = via.get_server_metadata()
    assert meta["version"] == direct.get_server_metadata()["version"]
    errors = []
    for client in (direct, via):
        with pytest.raises(InferenceServerException) as err:
            client.get_model_metadata("nope")
        errors.append((err.value.status(), err.value.message()))
    assert errors[0] == errors[1] == ("404", "Request for unknown model: 'nope' is not found")

    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 3, dtype=np.float32)

    def inputs(module: Any, binary: bool) -> list[Any]:
        out = []
        for name, value in (("INPUT0", a), ("INPUT1", b)):
            tensor = module.InferInput(name, list(value.shape), "FP32")
            tensor.set_data_from_numpy(value, binary_data=binary)
            out.append(tensor)
        return out

    def check(result: Any, outputs: tuple[str, ...] = ("OUTPUT0", "OUTPUT1")) -> Any:
        expect = {"OUTPUT0": a + b, "OUTPUT1": a - b}
        for name in outputs:
            np.testing.assert_array_equal(result.as_numpy(name), expect[name])
        return result.get_response()

    done = router.harness.router.counters.completed
    for binary in (True, False):
        for client in (direct, via):
            got = [check(client.infer("add_sub", inputs(th, binary)))]
            got.append(check(client.infer(
                "add_sub", inputs(th, binary), request_id="r1", parameters={"k": "v", "n": 2},
                outputs=[th.InferRequestedOutput("OUTPUT1", binary_data=not binary)]),
                ("OUTPUT1",)))
            got.append(check(client.infer("add_sub", inputs(th, binary),
                                          request_compression_algorithm="gzip",
                                          response_compression_algorithm="deflate")))
            if client is direct:
                want = got
        assert got == want
    with pytest.raises(InferenceServerException) as err:
        via.infer("nope", inputs(th, True))
    assert (err.value.status(), err.value.message()) == (
        "404", "Request for unknown model: 'nope' is not found")
    # Through the gateway, which speaks gRPC to Triton: 6 inferences completed there.
    assert router.harness.router.counters.completed - done == 6

    async def aio(url: str) -> list[Any]:
        client = tha.InferenceServerClient(url[len("http://"):])
        try:
            out: list[Any] = [await client.is_server_ready(),
                              await client.is_model_ready("add_sub"),
                              await client.get_model_metadata("delay"),
                              await client.get_model_config("add_sub"),
                              await client.get_model_repository_index()]
            for binary in (True, False):
                out.append(check(await client.infer("add_sub", inputs(tha, binary))))
            try:
                await client.infer("add_sub", inputs(tha, True)[:1])
            except InferenceServerException as exc:
                out.append((exc.status(), exc.message()))
            return out
        finally:
            await client.close()
    want_aio = asyncio.run(aio(tritons[1].http_url))
    assert asyncio.run(aio(router.url)) == want_aio
    assert want_aio[-1][0] == "400" and "INPUT1" in want_aio[-1][1]


def test_infer_json_and_binary_tensors_match_triton(router: HttpRouter,
                                                    tritons: list[TritonServer]) -> None:
    t = tritons[0]
    path = "/v2/models/add_sub/infer"
    same(t, router, "POST", path, add_sub())
    same(t, router, "POST", path, add_sub(id="abc", outputs=[{"name": "OUTPUT1"}],
                                          parameters={"foo": "bar", "n": 3, "f": 1.5,
                                                      "b": True, "priority": 1,
                                                      "timeout": 10_000_000}))
    same(t, router, "POST", path, add_sub(parameters={"binary_data_output": True}))
    same(t, router, "POST", path, add_sub(outputs=[
        {"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}]))
    same(t, router, "POST", path, add_sub(outputs=[
        {"name": "OUTPUT0", "parameters": {"binary_data": False}}],
        parameters={"binary_data_output": True}))
    # Classification: Triton computes the top classes; the router passes the parameter on.
    batch2 = {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [2, 4], "data": [[1, 2, 3, 4],
                                                                        [5, 6, 7, 8]]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [2, 4], "data": [1, 1, 1, 1, 0, 0, 0, 0]}]}
    got = same(t, router, "POST", path, {**batch2, "outputs": [
        {"name": "OUTPUT0", "parameters": {"classification": 2}},
        {"name": "OUTPUT1", "parameters": {"classification": 3, "binary_data": True}}]})
    assert got.json()["outputs"][0]["data"] == ["5.000000:3", "4.000000:2", "8.000000:3",
                                                "7.000000:2"]
    # Binary inputs, and a mix of binary and JSON.
    a = np.arange(16, dtype=np.float32).reshape(2, 8)
    b = (np.arange(16, dtype=np.float32) * 0.1).reshape(2, 8)
    body, headers = binary_body({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [2, 8],
         "parameters": {"binary_data_size": a.nbytes}},
        {"name": "INPUT1", "datatype": "FP32", "shape": [2, 8],
         "parameters": {"binary_data_size": b.nbytes}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}},
                    {"name": "OUTPUT1"}]}, a.tobytes(), b.tobytes())
    got = same(t, router, "POST", path, body, headers)
    assert got.content_type == "application/octet-stream"
    np.testing.assert_array_equal(np.frombuffer(got.binary(), np.float32).reshape(2, 8), a + b)
    assert got.json()["outputs"][1]["data"] == (a - b).reshape(-1).tolist()
    body, headers = binary_body({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [2, 8], "data": a.tolist()},
        {"name": "INPUT1", "datatype": "FP32", "shape": [2, 8],
         "parameters": {"binary_data_size": b.nbytes}}]}, b.tobytes())
    same(t, router, "POST", path, body, headers)
    # Zero-element tensors, compressed requests, a raw binary request (no JSON at all).
    same(t, router, "POST", path, {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 0], "data": []},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 0], "data": []}]})
    for encoding, pack in (("gzip", gzip.compress), ("deflate", _deflate)):
        same(t, router, "POST", path, pack(json.dumps(add_sub()).encode()),
             {"Content-Encoding": encoding})
    payload = np.arange(6, dtype=np.float32).tobytes()
    same(t, router, "POST", "/v2/models/delay/infer", payload,
         {"Inference-Header-Content-Length": "0"})
    same(t, router, "POST", "/v2/models/delay/versions/1/infer", {"inputs": [
        {"name": "PAYLOAD", "datatype": "FP32", "shape": [3], "data": [1.5, -2, 1e30]}]})


def _deflate(data: bytes) -> bytes:
    import zlib
    return zlib.compress(data)


def test_every_datatype_and_bytes_tensors_match_triton(router: HttpRouter,
                                                       tritons: list[TritonServer]) -> None:
    """Datatypes as JSON and as binary data, against Triton's own checks of them (the delay
    model takes FP32 only: the others must be refused, by the router, in Triton's words),
    and BYTES tensors through an identity model."""
    t = tritons[0]
    path = "/v2/models/delay/infer"
    for datatype, data in (("BOOL", [True, False]), ("UINT8", [1, 300]), ("INT8", [-1, 2]),
                           ("UINT16", [1, 2]), ("INT16", [-3, 4]), ("UINT32", [1, 2]),
                           ("INT32", [-5, 6]), ("UINT64", [2**64 - 1, 0]),
                           ("INT64", [-(2**63), 1]), ("FP64", [0.5, 1e300]),
                           ("FP16", [1, 2]), ("BF16", [1, 2]), ("BYTES", ["a", "b"])):
        same(t, router, "POST", path, {"inputs": [
            {"name": "PAYLOAD", "datatype": datatype, "shape": [2], "data": data}]})
        body, headers = binary_body({"inputs": [
            {"name": "PAYLOAD", "datatype": datatype, "shape": [2],
             "parameters": {"binary_data_size": 4}}]}, b"\0\0\0\0")
        same(t, router, "POST", path, body, headers)
    if not _available(BYTES_MODEL):
        pytest.skip(f"no {BYTES_MODEL} model in {EXAMPLES}")
    path = f"/v2/models/{BYTES_MODEL}/infer"
    same(t, router, "POST", path, {"inputs": [
        {"name": "INPUT0", "datatype": "BYTES", "shape": [1, 4],
         "data": [["a", "", "h\u00e9llo \u2603", "tab\tquote\"nul\u0000"]]}]})
    raw = strings(b"\xff\x00a", b"", "\u2603".encode())
    for outputs in (None, [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]):
        doc: dict[str, Any] = {"inputs": [{"name": "INPUT0", "datatype": "BYTES",
                                           "shape": [1, 3],
                                           "parameters": {"binary_data_size": len(raw)}}]}
        if outputs:
            doc["outputs"] = outputs
        body, headers = binary_body(doc, raw)
        got = same(t, router, "POST", path, body, headers)
        if outputs:
            assert got.binary() == raw
        else:  # bytes that are not UTF-8 come back in the JSON as they are, as Triton does
            assert b'"\xff\\u0000a"' in got.body
    same(t, router, "POST", path, {"inputs": [
        {"name": "INPUT0", "datatype": "BYTES", "shape": [1, 2], "data": ["a", 5]}]},
        triton_status=500)
    same(t, router, "POST", path, {"inputs": [
        {"name": "INPUT0", "datatype": "BYTES", "shape": [1, 3], "data": ["a", "b"]}]})


def test_sequences_keep_their_replica_with_int_and_string_ids(
        router: HttpRouter, tritons: list[TritonServer]) -> None:
    """``sequence_id`` (integer or string), ``sequence_start`` and ``sequence_end`` reach the
    gateway with the gRPC types it reads them by: each sequence's running sum stays whole."""
    for model, ids in (("accumulate", [11, 12, 2**64 - 1]), ("accumulate_str", ["s-1", "s-2"])):
        batching = fetch(router.url, "GET", f"/v2/models/{model}/config").json()[
            "max_batch_size"] > 0
        for sid in ids:
            sums = []
            for i, value in enumerate((1, 2, 3)):
                got = fetch(router.url, "POST", f"/v2/models/{model}/infer", {
                    "inputs": [{"name": "INPUT", "datatype": "INT64",
                                "shape": [1, 1] if batching else [1], "data": [value]}],
                    "parameters": {"sequence_id": sid, "sequence_start": i == 0,
                                   "sequence_end": i == 2}})
                assert got.status == 200, got
                sums.append(got.json()["outputs"][0]["data"][0])
            assert sums == [1, 3, 6], (model, sid)


def test_bad_requests_get_tritons_answer(router: HttpRouter,
                                         tritons: list[TritonServer]) -> None:
    """Status, content type and message as Triton's for what Triton itself refuses before or
    after parsing (the message of a request the router's validator refuses is compared with
    what Triton says at test time); malformed bodies are 400 here, 500 in Triton."""
    t = tritons[0]
    path = "/v2/models/add_sub/infer"
    bad_input = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
    other = {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": [1, 1, 1, 1]}
    doc: Any
    for doc in (
            {"inputs": [dict(bad_input, datatype="FP64"), other]},       # wrong datatype
            {"inputs": [dict(bad_input, shape=[4]), dict(other, shape=[4])]},  # wrong shape
            {"inputs": [bad_input]},                                     # missing input
            {"inputs": [bad_input, dict(other, name="INPUTX")]},        # unknown input
            {"inputs": [bad_input, bad_input]},                          # twice
            {"inputs": [bad_input, other], "id": "rid-7", "outputs": [{"name": "NOPE"}]},
            {"inputs": [dict(bad_input, datatype="FP16"), other]},       # FP16 as JSON
            {"inputs": [dict(bad_input, datatype="WHAT"), other]},
            {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4]}, other]},
            {"inputs": [dict(bad_input, parameters={"binary_data_size": 16}), other]},
            {"inputs": [bad_input, other], "parameters": {"triton_x": 1}},
            {"inputs": [bad_input, other], "parameters": {"x": [1]}},
            {"inputs": [dict(bad_input, shape=[0, 4], data=[]),
                        dict(other, shape=[0, 4], data=[])]}):
        same(t, router, "POST", path, doc)
    for doc in (
            {"inputs": [dict(bad_input, data=[1, 2, 3]), other]},        # data vs shape
            {"inputs": [dict(bad_input, data=[1, 2, 3, 4, 5]), other]},
            {"inputs": [dict(bad_input, data=[1, 2, "x", 4]), other]},
            {"inputs": [dict(bad_input, data=[[1, 2], [3, True]]), other]},
            {"inputs": [dict(bad_input, shape=[1, -4]), other]},
            {"inputs": [dict(bad_input, name=5), other]},
            {"inputs": [bad_input, other], "id": 5},
            {"inputs": [bad_input, other], "parameters": {"sequence_id": 1.5}},
            {"inputs": [bad_input, other], "parameters": {"sequence_start": 1}},
            {"inputs": [bad_input, other], "parameters": {"priority": -1}},
            {"inputs": [bad_input, other], "parameters": 7},
            {"inputs": [bad_input, other], "outputs": {}},
            {"inputs": {}},
            [],
            {}):
        same(t, router, "POST", path, doc, triton_status=500)
    for text in (b"{bad json", b'{"inputs": [}', b'{"inputs": []} extra', b'{"a": "b',
                 b'{"a" 1}', b"[1, 2 3]", b'{"a": 1 "b": 2}', b" \n ", b'{"a": "\\x"}',
                 b'{"a": tru}', b'[1.]', b'{"a": 1.5e+}', b'[-x]', b'[Nax]', b'2 3',
                 b'{"a": [1, 2}', b'{"a": 1,}', b'[1,]', b'{"\xff": 1} x'):
        same(t, router, "POST", path, text, triton_status=500)
    # The binary tensor data extension's own checks.
    same(t, router, "POST", path, add_sub(), {"Inference-Header-Content-Length": "9999"})
    same(t, router, "POST", path, add_sub(), {"Inference-Header-Content-Length": "-5"})
    same(t, router, "POST", path, b"")  # a raw request, of a model with two inputs
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2],
                       "parameters": {"binary_data_size": 8}}, other]}
    for tail in (b"\0" * 4, b"\0" * 8 + b"extra"):
        body, headers = binary_body(doc, tail)
        same(t, router, "POST", path, body, headers)
    same(t, router, "POST", "/v2/models/nope/infer", add_sub())
    same(t, router, "POST", "/v2/models/add_sub/versions/3/infer", add_sub())
    same(t, router, "POST", path, add_sub(), {"Content-Encoding": "br"})
    if _available(DECOUPLED_MODEL):  # the HTTP endpoint does not take decoupled models
        same(t, router, "POST", f"/v2/models/{DECOUPLED_MODEL}/infer", {"inputs": [
            {"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]},
            {"name": "DELAY", "datatype": "UINT32", "shape": [1], "data": [0]},
            {"name": "WAIT", "datatype": "UINT32", "shape": [1], "data": [0]}]})


def test_generate_matches_triton(router: HttpRouter, tritons: list[TritonServer]) -> None:
    t = tritons[0]
    for path in ("/v2/models/add_sub/generate", "/v2/models/add_sub/generate_stream"):
        same(t, router, "POST", path, {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]})
        same(t, router, "POST", path, {"INPUT0": [1, 2, 3, 4], "id": "g1", "flag": True,
                                       "parameters": {"INPUT1": [2, 2, 2, 2], "n": 2,
                                                      "f": 0.5, "s": "x"}})
        same(t, router, "POST", path, {"INPUT0": [1, 2, 3, 4]})
        same(t, router, "POST", path, {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1],
                                       "parameters": {"INPUT1": [2, 2, 2, 2]}})
        same(t, router, "POST", path, {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1],
                                       "x": [1]})
        same(t, router, "POST", path, {"INPUT0": [[1, 2], [3, 4]], "INPUT1": [1, 1, 1, 1]},
             triton_status=500)
        same(t, router, "POST", path, {"INPUT0": [1], "INPUT1": [1], "parameters": 5},
             triton_status=500)
        same(t, router, "POST", path, b"{bad", triton_status=500)
        same(t, router, "POST", path, b"", triton_status=500)
    same(t, router, "POST", "/v2/models/delay/generate", {"PAYLOAD": [1, 2]})
    same(t, router, "POST", "/v2/models/delay/generate", {"PAYLOAD": 7})
    same(t, router, "POST", "/v2/models/nope/generate", {"IN": [1]})
    same(t, router, "POST", "/v2/models/add_sub/versions/9/generate_stream", {"IN": [1]})
    same(t, router, "POST", "/v2/models/delay/generate", {"PAYLOAD": [1]},
         {"Content-Encoding": "gzip"})
    if _available(BYTES_MODEL):
        for kind in ("generate", "generate_stream"):
            same(t, router, "POST", f"/v2/models/{BYTES_MODEL}/{kind}", {"INPUT0": "h\u00e9"})
    if not _available(DECOUPLED_MODEL):
        pytest.skip(f"no {DECOUPLED_MODEL} model in {EXAMPLES}")
    # A decoupled model: one upstream stream; an event per response.
    path = f"/v2/models/{DECOUPLED_MODEL}"
    three = {"IN": [1, 2, 3], "DELAY": [0, 0, 0], "WAIT": 0}
    got = same(t, router, "POST", path + "/generate_stream", three)
    assert got.content_type == "text/event-stream; charset=utf-8"
    assert got.body.count(b"data: ") == 3 and got.body.endswith(b"\n\n")
    same(t, router, "POST", path + "/generate", three)  # exactly one response is expected
    same(t, router, "POST", path + "/generate", {"IN": [7], "DELAY": [0], "WAIT": 0})
    same(t, router, "POST", path + "/generate_stream", {"IN": [], "DELAY": [], "WAIT": 0})
    same(t, router, "POST", path + "/generate", {"IN": [], "DELAY": [], "WAIT": 0})
    same(t, router, "POST", path + "/generate_stream", {"IN": [1], "DELAY": [0]})
    same(t, router, "POST", path + "/generate_stream", {"IN": [1], "DELAY": [0], "WAIT": [0, 1]})
    assert router.harness.router.counters.streams >= 6


def test_what_a_router_cannot_do_is_501_saying_why(router: HttpRouter,
                                                   tritons: list[TritonServer]) -> None:
    for method, path, why in (
            ("POST", "/v2/cudasharedmemory/region/r/register", "CUDA shared memory"),
            ("POST", "/v2/repository/models/add_sub/load", "model placement"),
            ("POST", "/v2/repository/models/add_sub/unload", "model placement"),
            ("GET", "/v2/trace/setting", "trace settings act on one server"),
            ("POST", "/v2/models/add_sub/trace/setting", "trace settings act on one server"),
            ("GET", "/v2/logging", "log settings act on one server")):
        got = fetch(router.url, method, path, {"key": "/x", "byte_size": 4}
                    if method == "POST" else None)
        assert (got.status, got.content_type) == (501, "application/json"), (path, got)
        assert why in got.json()["error"], (path, got)


def test_system_shared_memory_over_http_as_triton_answers(router: HttpRouter,
                                                          tritons: list[TritonServer]) -> None:
    """tritonclient.http's shared-memory calls, directly and through the router (on this
    host): the same outputs in the region, the same status and errors."""
    import tritonclient.utils.shared_memory as shm

    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.float32)
    seen = []
    for url in (tritons[0].http_url, router.url):
        client = th.InferenceServerClient(url.removeprefix("http://"))
        client.unregister_system_shared_memory()
        tag = url.rsplit(":", 1)[1]
        hin = shm.create_shared_memory_region(f"hin{tag}", f"/meshd_hin_{tag}", 128)
        hout = shm.create_shared_memory_region(f"hout{tag}", f"/meshd_hout_{tag}", 128)
        try:
            shm.set_shared_memory_region(hin, [a, b])
            client.register_system_shared_memory("input", f"/meshd_hin_{tag}", 128)
            client.register_system_shared_memory("output", f"/meshd_hout_{tag}", 128)
            status = sorted(r["name"] for r in client.get_system_shared_memory_status())
            inputs = [th.InferInput("INPUT0", [1, 16], "FP32"),
                      th.InferInput("INPUT1", [1, 16], "FP32")]
            inputs[0].set_shared_memory("input", 64)
            inputs[1].set_shared_memory("input", 64, offset=64)
            outputs = [th.InferRequestedOutput("OUTPUT0", binary_data=True),
                       th.InferRequestedOutput("OUTPUT1", binary_data=True)]
            outputs[0].set_shared_memory("output", 64)
            outputs[1].set_shared_memory("output", 64, offset=64)
            result = client.infer("add_sub", inputs, outputs=outputs)
            body = result.get_response()
            out = (shm.get_contents_as_numpy(hout, np.float32, [1, 16]).copy(),
                   shm.get_contents_as_numpy(hout, np.float32, [1, 16], offset=64).copy())
            errors = []
            for call, args in ((client.register_system_shared_memory,
                                ("input", f"/meshd_hin_{tag}", 128)),
                               (client.get_system_shared_memory_status, ("nope",)),
                               (client.register_system_shared_memory,
                                ("bad", "/meshd-nokey", 8))):
                with pytest.raises(InferenceServerException) as err:
                    call(*args)
                errors.append((err.value.status(), err.value.message()))
            client.unregister_system_shared_memory()
            seen.append((status, [o["name"] for o in body["outputs"]],
                         [o.get("parameters", {}) for o in body["outputs"]], errors,
                         client.get_system_shared_memory_status()))
            np.testing.assert_array_equal(out[0], a + b)
            np.testing.assert_array_equal(out[1], a - b)
        finally:
            shm.destroy_shared_memory_region(hin)
            shm.destroy_shared_memory_region(hout)
    assert seen[0] == seen[1], seen


# --- overload, auth, TLS ---------------------------------------------------------------------

def test_a_shed_request_is_429_with_retry_after(tritons: list[TritonServer]) -> None:
    r = _start(tritons[:1], limiter=LimiterConfig(initial=2, min_limit=2, max_limit=2))
    tritons[0].set_behaviour("delay", delay_ms=300)
    try:
        outcomes: list[Answer] = []

        def one(_: int) -> None:
            outcomes.append(fetch(r.url, "POST", "/v2/models/delay/infer", {"inputs": [
                {"name": "PAYLOAD", "datatype": "FP32", "shape": [4], "data": [0, 0, 0, 0]}]},
                timeout=10))
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(8)))
        assert time.monotonic() - t0 < 5  # refused at once, never a timeout
        assert [a.status for a in outcomes].count(200) >= 1
        shed = [a for a in outcomes if a.status != 200]
        assert shed and {a.status for a in shed} == {429}, outcomes
        for a in shed:
            assert a.content_type == "application/json"
            assert a.json()["error"].startswith("shed: ")
            assert int(a.headers["retry-after"]) >= 1 and int(a.headers["retry-after-ms"]) >= 1
        c = r.harness.router.counters
        until(lambda: c.inflight() == 0, 10)
        assert sum(c.shed.values()) == len(shed)
        client = th.InferenceServerClient(r.url[len("http://"):], concurrency=8)
        inp = th.InferInput("PAYLOAD", [4], "FP32")
        inp.set_data_from_numpy(np.zeros(4, np.float32))
        pending = [client.async_infer("delay", [inp]) for _ in range(8)]
        statuses = []
        for p in pending:
            try:
                p.get_result()
                statuses.append("200")
            except InferenceServerException as exc:
                statuses.append(exc.status())
        assert "429" in statuses and set(statuses) <= {"200", "429"}, statuses
    finally:
        tritons[0].clear_behaviour()
        r.close()


def test_bearer_tokens_are_required_when_configured(router: HttpRouter, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# tenant sha256\nteam-a {token_hash('s3cret')}\n")
    url = router.serve(ClientAuth(dev=False, tokens=load_tokens(tokens)))
    c = router.harness.router.counters
    before = c.failed.get("UNAUTHENTICATED", 0)
    for headers, why in (({}, "present a bearer token"),
                         ({"Authorization": "Bearer nope"}, "unknown bearer token"),
                         ({"Authorization": "Basic czNjcmV0"}, "must be 'Bearer <token>'"),
                         ({"x-meshd-tenant": "team-a"}, "present a bearer token")):
        for method, path, body in (("POST", "/v2/models/add_sub/infer", add_sub()),
                                   ("GET", "/v2/health/live", None),
                                   ("GET", "/v2/models/add_sub", None),
                                   ("POST", "/v2/models/add_sub/generate", {"INPUT0": [1]})):
            got = fetch(url, method, path, body, headers)
            assert (got.status, got.content_type) == (401, "application/json"), (path, got)
            assert why in got.json()["error"] and got.headers["www-authenticate"] == "Bearer"
    assert c.failed.get("UNAUTHENTICATED", 0) == before + 4  # the infer requests
    ok = {"Authorization": "Bearer s3cret"}
    assert fetch(url, "POST", "/v2/models/add_sub/infer", add_sub(), ok).status == 200
    assert fetch(url, "GET", "/v2/health/ready", None, ok).status == 200
    client = th.InferenceServerClient(url[len("http://"):])
    assert client.is_server_live(headers=ok) and not client.is_server_live()
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("add_sub")
    assert (err.value.status(), err.value.message()) == (
        "401", "present a bearer token (this router takes tokens and asks for no client "
               "certificate)")


def test_a_mesh_client_certificate_is_read_from_the_tls_connection(tmp_path: Path) -> None:
    """Outside dev mode without tokens a client shows a mesh certificate: ClientAuth reads it
    from the TLS connection through the adapter (no certificate: 401; plaintext: no)."""
    td = "mesh.test"
    ca = CertificateAuthority.create(td)
    ca.mint(SpiffeId.node(td, "r1"), ["node"]).save(tmp_path / "node")
    ca.mint(SpiffeId.node(td, "c1"), ["node"]).save(tmp_path / "client")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(30)
    gw = Gateway(LocalScoring(Scorer(FusedState("r1")), loop.time), loop.time)
    server_ctx = tls.server_context(tmp_path / "node", require_client_cert=False)
    runner, addr = run(router_server.serve_http(gw, ("127.0.0.1", 0), ssl_context=server_ctx,
                                                auth=ClientAuth(dev=False)))
    try:
        url = f"https://{addr}"
        with_cert = tls.client_context(tmp_path / "client")
        anonymous = tls.client_context(None, bundle_pem=(tmp_path / "node" / "bundle.pem")
                                       .read_bytes())
        assert fetch(url, "GET", "/v2/health/live", context=with_cert).status == 200
        got = fetch(url, "GET", "/v2/health/live", context=anonymous)
        assert got.status == 401 and "mesh client certificate" in got.json()["error"]
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            fetch(f"http://{addr}", "GET", "/v2/health/live", timeout=5)
    finally:
        run(runner.cleanup())
        run(gw.close())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


# --- lifecycle and robustness ----------------------------------------------------------------

def test_every_infer_request_ends_once_in_the_lifecycle_counts(
        router: HttpRouter, tritons: list[TritonServer]) -> None:
    """Received = completed + failed + shed + invalid + cancelled once all have ended; a
    client that goes away cancels its request (and its upstream call)."""
    for server in tritons:
        server.set_behaviour("delay", delay_ms=1500)
    try:
        c = router.harness.router.counters
        path = "/v2/models/add_sub/infer"
        assert fetch(router.url, "POST", path, add_sub()).status == 200
        assert fetch(router.url, "POST", path, b"{bad").status == 400          # invalid
        assert fetch(router.url, "POST", path, {"inputs": [ADD_SUB["inputs"][0]]}).status \
            == 400                                                              # invalid
        assert fetch(router.url, "POST", "/v2/models/nope/infer", add_sub()).status == 404
        with pytest.raises((TimeoutError, socket.timeout, urllib.error.URLError)):
            fetch(router.url, "POST", "/v2/models/delay/infer", {"inputs": [
                {"name": "PAYLOAD", "datatype": "FP32", "shape": [1], "data": [0]}]},
                timeout=0.3)
        until(lambda: c.inflight() == 0 and c.requests == 5, 10)
        ended = c.completed + c.invalid + c.cancelled + sum(c.failed.values()) + \
            sum(c.shed.values())
        assert ended == c.requests == 5, c
        assert (c.completed, c.invalid, c.cancelled) == (1, 2, 1), c
    finally:
        for server in tritons:
            server.clear_behaviour()


def test_bodies_and_nesting_are_bounded(router: HttpRouter) -> None:
    """A body over the gateway's payload limit (plus room for its JSON) is refused before it
    is parsed, and so is JSON nested deeper than Python parses; both counted invalid."""
    gw = router.harness.router
    limit = gw.max_bytes
    gw.max_bytes = 1024
    try:
        url = router.serve(ClientAuth(dev=True))
    finally:
        gw.max_bytes = limit
    c = gw.counters
    before = c.invalid
    got = fetch(url, "POST", "/v2/models/delay/infer", b"0" * (2 << 20))
    assert (got.status, got.content_type) == (413, "application/json")
    assert "exceeds the router's limit" in got.json()["error"]
    for deep in (b"[" * 100_000, b'{"inputs": [{"data": ' + b"[" * 50_000 + b"]" * 50_000):
        got = fetch(router.url, "POST", "/v2/models/delay/infer", deep)
        assert got.status == 400 and got.json()["error"].startswith(
            "failed to parse the request JSON buffer"), got
    got = fetch(router.url, "POST", "/v2/models/delay/infer", {"inputs": [
        {"name": "PAYLOAD", "datatype": "FP32", "shape": [2],
         "data": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]], [[[2]]]]}]})
    assert got.status == 200, got  # nested data is flattened, as Triton flattens it
    assert c.invalid == before + 3


_names = st.sampled_from(["PAYLOAD", "INPUT0", "", "x" * 300, "\u2603", "PAYLOAD\x00"])
_datatypes = st.sampled_from(["FP32", "FP16", "BF16", "BYTES", "BOOL", "INT8", "UINT64",
                              "INT64", "nope", ""])
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=12)
_shapes = st.one_of(st.lists(st.integers(-2, 6), max_size=3), st.lists(
    st.integers(0, 2**64 + 5), max_size=2), _json_values)
_inputs = st.fixed_dictionaries(
    {"name": _names, "datatype": _datatypes, "shape": _shapes},
    optional={"data": st.one_of(st.lists(st.floats(allow_nan=False, width=32), max_size=8),
                                _json_values),
              "parameters": st.one_of(
                  st.fixed_dictionaries({"binary_data_size": st.integers(-1, 64)}),
                  st.fixed_dictionaries({"shared_memory_region": st.text(max_size=4)}),
                  _json_values)})
_docs = st.fixed_dictionaries(
    {"inputs": st.one_of(st.lists(_inputs, max_size=3), _json_values)},
    optional={"id": _json_values, "outputs": st.one_of(st.lists(st.fixed_dictionaries(
        {"name": _names}, optional={"parameters": _json_values}), max_size=2), _json_values),
        "parameters": st.one_of(st.dictionaries(st.sampled_from(
            ["sequence_id", "sequence_start", "priority", "timeout", "binary_data_output",
             "triton_x", "k"]), _json_values, max_size=3), _json_values)})


@st.composite
def _requests(draw: Any) -> tuple[bytes, dict[str, str]]:
    kind = draw(st.sampled_from(["doc", "doc+binary", "bytes", "mutated"]))
    if kind == "bytes":
        body = draw(st.binary(max_size=200))
    else:
        body = json.dumps(draw(_docs)).encode()
        if kind == "doc+binary":
            body += draw(st.binary(max_size=64))
        elif kind == "mutated" and body:
            cut = draw(st.integers(0, len(body)))
            body = body[:cut] + draw(st.binary(max_size=4)) + body[cut + 1:]
    headers: dict[str, str] = {}
    head = draw(st.one_of(st.none(), st.integers(-5, len(body) + 5).map(str),
                          st.text(alphabet="0123456789+- abc", max_size=6)))
    if head is not None and kind != "doc+binary":
        headers["Inference-Header-Content-Length"] = head
    elif kind == "doc+binary":
        headers["Inference-Header-Content-Length"] = str(len(body) - draw(
            st.integers(0, min(64, len(body)))))
    if draw(st.booleans()):
        headers["Content-Encoding"] = draw(st.sampled_from(["identity", "gzip", "br", "x"]))
    if draw(st.booleans()):
        headers["traceparent"] = draw(st.text(max_size=60).filter(
            lambda s: s.isprintable() and s.isascii()))
    return body, headers


def test_fuzzed_infer_requests_never_break_the_router(router: HttpRouter) -> None:
    """Random bodies and headers at POST .../infer: a 4xx (or a 200 for what happens to be a
    valid request), never a 500 or a hang; the router serves normally afterwards and every
    request was counted once."""
    conn = http.client.HTTPConnection(router.url[len("http://"):], timeout=20)
    statuses: list[int] = []

    @settings(max_examples=200, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(_requests())
    def check(request: tuple[bytes, dict[str, str]]) -> None:
        body, headers = request
        try:
            conn.request("POST", "/v2/models/delay/infer", body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (ConnectionError, http.client.HTTPException):
            conn.close()  # aiohttp closed a connection it could not parse: fine, once
            conn.request("GET", "/v2/health/live")
            assert conn.getresponse().read() == b""
            return
        statuses.append(resp.status)
        assert resp.status in (200, 400, 404, 413, 501), (resp.status, body, headers, data)
        if resp.status != 200:
            assert "error" in json.loads(data), data

    check()
    conn.close()
    assert statuses.count(400) > 50
    got = fetch(router.url, "POST", "/v2/models/delay/infer", {"inputs": [
        {"name": "PAYLOAD", "datatype": "FP32", "shape": [2], "data": [0, 0]}]})
    assert got.status == 200 and got.json()["outputs"][0]["data"] == [8]
    c = router.harness.router.counters
    until(lambda: c.inflight() == 0, 10)
    assert c.completed + c.invalid + c.cancelled + sum(c.failed.values()) + \
        sum(c.shed.values()) == c.requests


# --- the conversion, without Triton ----------------------------------------------------------

def test_request_parameters_travel_with_the_grpc_types_tritonclient_uses() -> None:
    doc = {"id": "r", "inputs": [
        {"name": "A", "datatype": "UINT8", "shape": [3], "data": [1, 255, 256]},
        {"name": "B", "datatype": "FP32", "shape": [1, 2], "data": [[0.1, 3]]},
        {"name": "C", "datatype": "BYTES", "shape": [2], "data": ["x", "\u2603"]},
        {"name": "D", "datatype": "BOOL", "shape": [2], "data": [True, False]},
        {"name": "E", "datatype": "INT16", "shape": [2], "data": [-1, 70000]},
        {"name": "F", "datatype": "FP16", "shape": [1], "parameters": {"binary_data_size": 2}}],
        "outputs": [{"name": "O", "parameters": {"classification": 3, "binary_data": True}},
                    {"name": "P"}],
        "parameters": {"sequence_id": 2**64 - 1, "sequence_start": True, "sequence_end": False,
                       "priority": 2, "timeout": 1500, "s": "v", "i": -3, "b": True,
                       "d": 0.25, "big": 2**70}}
    head = json.dumps(doc).encode()
    raw, req, plan = http_tensors.infer_request("m", "1", head + b"\x00\x3c", len(head))
    assert type(req).FromString(req.SerializeToString()) == type(req).FromString(raw)
    p = req.parameters
    assert p["sequence_id"].int64_param == -1  # uint64 bits, as Triton's C++ reads them back
    assert p["sequence_start"].bool_param and not p["sequence_end"].bool_param
    assert p["priority"].uint64_param == 2 and p["timeout"].int64_param == 1500
    assert (p["s"].string_param, p["i"].int64_param, p["b"].bool_param, p["d"].double_param,
            p["big"].double_param) == ("v", -3, True, 0.25, float(2**70))
    assert "binary_data_output" not in p
    assert plan.timeout == 0.0015 and plan.kind("O") == http_tensors.BINARY
    assert plan.kind("P") == http_tensors.JSON
    assert req.outputs[0].parameters["classification"].int64_param == 3
    contents = list(req.raw_input_contents)
    assert contents[0] == bytes([1, 255, 0])
    assert contents[1] == np.array([0.1, 3], np.float32).tobytes()
    assert contents[2] == strings(b"x", "\u2603".encode())
    assert contents[3] == b"\x01\x00"
    assert contents[4] == np.array([-1, 70000 - 65536], np.int16).tobytes()
    assert contents[5] == b"\x00\x3c"
    assert [list(t.shape) for t in req.inputs] == [[3], [1, 2], [2], [2], [2], [1]]
    assert req.id == "r" and (req.model_name, req.model_version) == ("m", "1")


def test_a_reply_is_cut_without_copying_its_tensors() -> None:
    from tritonclient.grpc import service_pb2
    resp = service_pb2.ModelInferResponse(model_name="m", model_version="1", id="x")
    resp.parameters["p"].int64_param = 3
    for name, datatype, shape, data in (
            ("A", "FP32", [2], np.array([1.5, -2], np.float32).tobytes()),
            ("B", "BYTES", [1, 2], strings(b"a", b"\xff")),
            ("C", "BOOL", [3], b"\x01\x00\x01"),
            ("D", "INT64", [1], np.array([-7], np.int64).tobytes())):
        out = resp.outputs.add()
        out.name, out.datatype = name, datatype
        out.shape.extend(shape)
        resp.raw_output_contents.append(data)
    reply = resp.SerializeToString()
    meta, raws = http_tensors.split_response(reply)
    assert [bytes(r) for r in raws] == list(resp.raw_output_contents)
    assert all(r.obj is reply for r in raws)  # views of the reply, not copies
    assert not meta.raw_output_contents and meta.outputs == resp.outputs
    body, head = http_tensors.render_infer(meta, raws, http_tensors.OutputPlan(
        kinds={"A": http_tensors.BINARY}))
    assert body[head:] == raws[0]
    assert b'"data":["a","\xff"]' in body[:head]  # bytes as they are, as Triton writes them
    doc = json.loads(body[:head].decode("utf-8", "surrogateescape"))
    assert doc == {"id": "x", "model_name": "m", "model_version": "1", "parameters": {"p": 3},
                   "outputs": [
                       {"name": "A", "datatype": "FP32", "shape": [2],
                        "parameters": {"binary_data_size": 8}},
                       {"name": "B", "datatype": "BYTES", "shape": [1, 2],
                        "data": ["a", "\udcff"]},
                       {"name": "C", "datatype": "BOOL", "shape": [3],
                        "data": [True, False, True]},
                       {"name": "D", "datatype": "INT64", "shape": [1], "data": [-7]}]}
    with pytest.raises(DecodeError):
        http_tensors.split_response(reply[:-1])


# --- forwarding to the replicas' own HTTP ports ------------------------------------------------

def _binary_infer(n: int = 16) -> tuple[bytes, dict[str, str]]:
    a = np.arange(n, dtype=np.float32).reshape(1, n)
    head = json.dumps({"inputs": [
        {"name": name, "datatype": "FP32", "shape": [1, n],
         "parameters": {"binary_data_size": a.nbytes}} for name in ("INPUT0", "INPUT1")],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    return head + a.tobytes() * 2, {"Inference-Header-Content-Length": str(len(head)),
                                    "Content-Type": "application/octet-stream",
                                    "Accept-Encoding": "gzip"}


def test_forwarded_requests_get_tritons_own_answer(tritons: list[TritonServer]) -> None:
    """Forwarded, the answer is Triton's as it wrote it: compressed as the client asked, the
    same bytes; a repeated request is recognised (no parsing, no validation)."""
    r = _start(tritons, http=True)
    try:
        body, headers = _binary_infer()
        want = fetch(tritons[0].http_url, "POST", "/v2/models/add_sub/infer", body, headers)
        for _ in range(3):
            got = fetch(r.url, "POST", "/v2/models/add_sub/infer", body, headers)
            assert (got.status, got.headers.get("content-encoding")) == (200, "gzip")
            assert gzip.decompress(got.body) == gzip.decompress(want.body)
            assert got.headers["inference-header-content-length"] == \
                want.headers["inference-header-content-length"]
        gw = r.harness.router
        assert len(gw.known) == 1 and gw.http_upstreams._session is not None
        assert gw.counters.completed >= 3
    finally:
        r.close()


def test_a_replica_whose_http_port_is_gone_fails_over(tritons: list[TritonServer]) -> None:
    """One replica advertises an HTTP port nothing listens on: every request is answered by
    the other, the failovers counted, the dead one's outcome reported (its limit backs off)."""
    port = free_port()  # a port nothing listens on
    h = RouterHarness(tritons, models=_models(tritons), http=True)
    h.http_addrs[0] = f"127.0.0.1:{port}"
    h.put("RoutingPolicy", "add_sub", {"strategy": "baseline_rr"})  # the dead one is tried
    h.refresh()
    runner, addr = h.call(router_server.serve_http(h.router, ("127.0.0.1", 0),
                                                   ssl_context=None))
    r = HttpRouter(h, runner, f"http://{addr}")
    try:
        time.sleep(0.2)  # the refresh above is applied on the harness's loop
        body, headers = _binary_infer()
        for _ in range(8):
            got = fetch(r.url, "POST", "/v2/models/add_sub/infer", body, headers)
            assert got.status == 200, got
        c = h.router.counters
        assert c.failovers >= 1 and c.completed >= 8 and not c.failed, c
    finally:
        r.close()


def _delay_http(client: th.InferenceServerClient, **kw: Any) -> Any:
    inp = th.InferInput("PAYLOAD", [16], "FP32")
    inp.set_data_from_numpy(np.zeros(16, dtype=np.float32))
    return client.infer("delay", [inp], **kw)


def test_forwarded_requests_are_hedged_around_a_stalled_replica(
        tritons: list[TritonServer]) -> None:
    r = _start(tritons, http=True)
    h = r.harness
    try:
        h.put("SloClass", "hedged", {"deadline_ms": 5000, "hedge_after_ms": 50})
        h.put("RoutingPolicy", "delay", {"strategy": "baseline_rr", "hedge_budget": 1.0})
        tritons[1].set_behaviour("delay", stall=True)
        via = th.InferenceServerClient(r.url.removeprefix("http://"))
        took = []
        for _ in range(10):
            t0 = time.monotonic()
            _delay_http(via, headers={"x-meshd-slo": "hedged"})
            took.append(time.monotonic() - t0)
        assert max(took) < 1.0, took  # a stall lasts 60 s; the hedge answered
        c = h.router.counters
        assert c.hedged >= 4 and c.hedge_won >= 4 and not c.failed, c
    finally:
        tritons[1].clear_behaviour()
        r.close()


def test_a_killed_replica_fails_over_over_http(triton_factory: Any) -> None:
    servers = triton_factory(2)
    r = _start(servers, http=True)
    h = r.harness
    try:
        h.put("RoutingPolicy", "delay", {"strategy": "baseline_rr"})
        via = th.InferenceServerClient(r.url.removeprefix("http://"))
        for _ in range(10):
            _delay_http(via)
        c = h.router.counters
        before = c.failovers + c.hedged
        servers[1].kill()
        for _ in range(40):
            _delay_http(via)  # none may fail
        assert c.failovers + c.hedged - before >= 10, c
    finally:
        r.close()
