"""Stateful sequences through routers: every request of a sequence reaches the replica that took
its START, whichever router node and router process it arrives at, unary or streamed, and a
sequence whose replica dies is named in the error, never silently restarted elsewhere.

Two real Triton servers serve ``accumulate`` (integer ids) and ``accumulate_str`` (string ids):
each keeps a running sum per sequence in its own memory, so a request that reached the wrong
replica gives a wrong sum or an error.  Three ways in, as clients behind an L4 balancer would
hit them: router node A (in-process, its own scorer), router node B (another scorer, its own
view of the same replicas) and two worker processes sharing a port that score through A.
"""

from __future__ import annotations

import itertools
import queue
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tc
from tritonclient.utils import InferenceServerException

from meshd.dev.ports import free_port
from meshd.dev.triton import TritonServer
from meshd.router.counters import WorkerCounters
from meshd.router.pool import WorkerPool
from meshd.score import link as score_link
from meshd.score import service as score_api
from meshd.score.sequences import sequence_key
from tests.test_router import RouterHarness, until

SEQ_REPO = Path(__file__).parent / "triton_sequences"
MODELS = ("accumulate", "accumulate_str")
STEPS = 10


@dataclass
class Mesh:
    a: RouterHarness
    b: RouterHarness
    workers: str
    servers: list[TritonServer]

    def entries(self) -> list[str]:
        return [self.a.addr, self.b.addr, self.workers]


def _client(addr: str) -> tc.InferenceServerClient:
    """A client with a connection of its own (so worker connections spread over processes)."""
    return tc.InferenceServerClient(addr, channel_args=[("grpc.use_local_subchannel_pool", 1)])


@pytest.fixture
def mesh(triton_factory: Any) -> Iterator[Mesh]:
    servers = triton_factory(2, repo=SEQ_REPO)
    uneven = (0.002, 0.008)  # one replica predicted 4x slower than the other
    a = RouterHarness(servers, models=MODELS, spu=uneven)
    b = RouterHarness(servers, models=MODELS, spu=uneven)
    d = tempfile.mkdtemp(prefix="meshd-seq-")
    score, where = a.call(score_api.serve(a.scorer, a.loop.time, f"{d}/score.sock",
                                          lambda: None, WorkerCounters()))
    link, _ = a.call(score_link.serve(a.scorer, a.loop.time, f"{d}/link.sock"))
    addr = f"127.0.0.1:{free_port()}"
    pool = WorkerPool(2, ["--score", where, "--link", f"{d}/link.sock", "--router", addr,
                          "--data", d, "--node", "w", "--dev", "--log-level", "warning"])
    a.call(pool.start())

    def live() -> bool:
        try:
            return bool(_client(addr).is_server_live())
        except InferenceServerException:
            return False
    try:
        until(lambda: len(pool.pids()) == 2 and live())
        yield Mesh(a, b, addr, servers)
    finally:
        a.call(pool.stop(2))
        a.call(score.stop(0))
        link.close()
        a.close()
        b.close()
        shutil.rmtree(d, ignore_errors=True)


def _inputs(value: int) -> list[tc.InferInput]:
    inp = tc.InferInput("INPUT", [1, 1], "INT64")
    inp.set_data_from_numpy(np.array([[value]], dtype=np.int64))
    return [inp]


def step(client: tc.InferenceServerClient, model: str, sid: int | str, value: int,
         start: bool = False, end: bool = False) -> int:
    result = client.infer(model, _inputs(value), sequence_id=sid, sequence_start=start,
                          sequence_end=end)
    return int(result.as_numpy("OUTPUT")[0][0])


def _unary_sequence(entries: list[str], model: str, sid: int | str) -> list[int]:
    """One sequence over unary calls, each request through the next way in."""
    clients = [_client(e) for e in entries for _ in range(2)]
    ways = itertools.cycle(clients)
    return [step(next(ways), model, sid, i + 1, start=i == 0, end=i == STEPS - 1)
            for i in range(STEPS)]


def _streamed_sequence(entry: str, model: str, sid: int | str) -> list[int]:
    """One sequence over one stream (messages sent back to back, replies in order)."""
    client = _client(entry)
    replies: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put(error or result))
    try:
        for i in range(STEPS):
            client.async_stream_infer(model, _inputs(i + 1), sequence_id=sid,
                                      sequence_start=i == 0, sequence_end=i == STEPS - 1)
        out = []
        for _ in range(STEPS):
            got = replies.get(timeout=30)
            if isinstance(got, Exception):
                raise got
            out.append(int(got.as_numpy("OUTPUT")[0][0]))
        return out
    finally:
        client.stop_stream()


def test_sixteen_concurrent_sequences_keep_their_state_through_two_routers_and_workers(
        mesh: Mesh) -> None:
    entries = mesh.entries()
    want = list(itertools.accumulate(range(1, STEPS + 1)))
    results: dict[int, list[int] | BaseException] = {}

    def run(k: int) -> None:
        model = MODELS[k % 2]
        sid: int | str = 7000 + k if model == "accumulate" else f"session-{k}"
        try:
            if k % 4 < 2:
                results[k] = _unary_sequence(entries[k % 3:] + entries[:k % 3], model, sid)
            else:
                results[k] = _streamed_sequence(entries[k % 3], model, sid)
        except BaseException as exc:  # noqa: BLE001 - reported below
            results[k] = exc

    threads = [threading.Thread(target=run, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    errors = {k: r for k, r in results.items() if isinstance(r, BaseException)}
    assert not errors, {k: str(e) for k, e in errors.items()}
    assert len(results) == 16 and all(r == want for r in results.values()), results

    # Both replicas served sequences (rendezvous spreads them), each request exactly once.
    stats = [s for server in mesh.servers
             for s in tc.InferenceServerClient(server.grpc_url).get_inference_statistics(
                 as_json=True)["model_stats"]]
    per_server = [sum(int(s.get("inference_count", 0)) for s in stats[i * 2:i * 2 + 2])
                  for i in range(2)]
    assert sum(per_server) == 16 * STEPS and min(per_server) > 0, per_server


def test_a_sequence_started_on_one_router_continues_on_another(mesh: Mesh) -> None:
    a, b, w = (_client(e) for e in mesh.entries())
    assert step(a, "accumulate", 42, 5, start=True) == 5
    assert step(b, "accumulate", 42, 6) == 11  # B has no record: rendezvous finds it
    assert step(w, "accumulate", 42, 7) == 18
    assert step(b, "accumulate_str", "42", 1, start=True) == 1  # "42" is not 42
    assert step(a, "accumulate", 42, 1, end=True) == 19
    assert step(w, "accumulate_str", "42", 2, end=True) == 3
    # A request in the middle of a sequence nobody holds gets Triton's own answer.
    with pytest.raises(InferenceServerException, match="START flag"):
        step(b, "accumulate", 999, 1)


def test_a_replica_killed_mid_sequence_names_the_lost_sequence(mesh: Mesh) -> None:
    a, b = _client(mesh.a.addr), _client(mesh.b.addr)
    assert step(a, "accumulate", 4242, 3, start=True) == 3
    key = sequence_key("accumulate", "", 4242)
    record = mesh.a.scorer.sequences.get(key, mesh.a.loop.time())
    assert record is not None
    holder = next(s for s in mesh.servers if s.grpc_url == record.endpoint)
    other = next(s for s in mesh.servers if s is not holder)
    holder.kill()
    for client in (a, b):  # A knows where it lived; B finds the holder unreachable
        with pytest.raises(InferenceServerException) as err:
            step(client, "accumulate", 4242, 1)
        assert err.value.status() == "StatusCode.ABORTED", err.value
        assert "sequence 4242 of model 'accumulate' was lost" in str(err.value)
    # Never restarted elsewhere: the surviving replica has no state for it.
    direct = tc.InferenceServerClient(other.grpc_url)
    with pytest.raises(InferenceServerException, match="START flag"):
        step(direct, "accumulate", 4242, 1)
    # A new sequence starts on the survivor.
    until(lambda: _restart(a))


def _restart(client: tc.InferenceServerClient) -> bool:
    try:
        return step(client, "accumulate", 4243, 2, start=True, end=True) == 2
    except InferenceServerException:
        return False
