"""The score link: frames split anywhere reassemble; bad frames are counted and close the
connection; fuzzed bytes never break the agent's side; a real socket round trip."""

from __future__ import annotations

import asyncio
import shutil
import struct
import tempfile
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshd.score import link as score_link
from meshd.score.link import ERROR, HEDGE, HEDGED, REPORT, SCORE, SCORED, FrameError, Frames
from proto.mesh.v1 import score_pb2
from tests.test_score import NOW, Mesh, rep


@given(st.lists(st.tuples(st.sampled_from(sorted(score_link.KINDS)),
                          st.integers(0, 2**32 - 1), st.binary(max_size=300)), max_size=8),
       st.lists(st.integers(1, 64), max_size=40))
def test_frames_reassemble_however_the_bytes_are_split(
        frames: list[tuple[int, int, bytes]], cuts: list[int]) -> None:
    data = b"".join(score_link.frame(*f) for f in frames)
    reader, got, pos = Frames(), [], 0
    for n in cuts:
        got += reader.feed(data[pos:pos + n])
        pos += n
    got += reader.feed(data[pos:])
    assert got == frames


@pytest.mark.parametrize("data, why", [
    (struct.pack(">IBI", 4, SCORE, 1), "length 4"),
    (struct.pack(">IBI", score_link.MAX_FRAME + 1, SCORE, 1), "length"),
    (struct.pack(">IBI", 5, 99, 1), "kind 99"),
])
def test_a_bad_header_is_a_frame_error(data: bytes, why: str) -> None:
    with pytest.raises(FrameError, match=why):
        Frames().feed(data)


class Wire(asyncio.Transport):
    """What the agent's side wrote, and whether it closed."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.out += data

    def close(self) -> None:
        self.closed = True


def _server() -> tuple[score_link.LinkServer, Wire, Counter[str], Any]:
    m = Mesh()
    m.node("a", rep("a:1", spu=0.001))
    m.node("b", rep("b:1", spu=0.003))
    scorer = m.scorer()
    counts: Counter[str] = Counter()
    srv = score_link.LinkServer(scorer, lambda: NOW, counts)
    wire = Wire()
    srv.connection_made(wire)
    return srv, wire, counts, scorer


def test_score_report_hedge_and_refusals() -> None:
    srv, wire, counts, scorer = _server()
    req = score_pb2.ScoreRequest(model="m", payload_bytes=10).SerializeToString()
    bad = score_pb2.ScoreRequest(model="").SerializeToString()
    srv.data_received(score_link.frame(SCORE, 7, req) + score_link.frame(SCORE, 8, bad))
    (k1, c1, p1), (k2, c2, p2) = Frames().feed(bytes(wire.out))
    reply = score_pb2.ScoreReply.FromString(p1)
    assert (k1, c1) == (SCORED, 7) and reply.verdict.admit and reply.decision_id
    assert (k2, c2) == (ERROR, 8) and p2.decode().startswith("model:")
    wire.out.clear()
    first = reply.targets[0].replica
    srv.data_received(score_link.frame(HEDGE, 9, score_pb2.HedgeRequest(
        decision_id=reply.decision_id, replica=first).SerializeToString()))
    [(k, c, p)] = Frames().feed(bytes(wire.out))
    assert (k, c) == (HEDGED, 9) and not score_pb2.HedgeReply.FromString(p).found
    wire.out.clear()
    # a batch with one bad report is refused whole
    batch = score_pb2.OutcomeBatch(reports=[
        score_pb2.OutcomeReport(decision_id=reply.decision_id, replica=first, last=True),
        score_pb2.OutcomeReport(decision_id=reply.decision_id, status=42)])
    srv.data_received(score_link.frame(REPORT, 0, batch.SerializeToString()))
    [(k, _, p)] = Frames().feed(bytes(wire.out))
    assert k == ERROR and "reports[1].status" in p.decode()
    assert scorer.decisions.get(reply.decision_id) is not None
    del batch.reports[1]
    srv.data_received(score_link.frame(REPORT, 0, batch.SerializeToString()))
    assert scorer.decisions.get(reply.decision_id) is None
    assert counts == Counter({"score": 2, "reports": 1, "hedge": 1}) and not wire.closed


@pytest.mark.parametrize("data", [
    struct.pack(">IBI", 5, 77, 0),                                   # unknown kind
    score_link.frame(SCORED, 1, b""),                                # a kind workers never send
    score_link.frame(SCORE, 1, b"\xff\xff\xff"),                     # not a ScoreRequest
    struct.pack(">IBI", 1 << 30, SCORE, 1),                          # beyond the bound
])
def test_a_malformed_frame_is_counted_and_closes_the_link(data: bytes) -> None:
    srv, wire, counts, _ = _server()
    srv.data_received(data)
    assert counts["malformed"] == 1 and wire.closed


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_fuzzed_bytes_are_answered_or_counted_never_raised(data: bytes) -> None:
    srv, wire, counts, scorer = _server()
    srv.data_received(data)
    srv.data_received(score_link.frame(REPORT, 0, data))
    srv.data_received(score_link.frame(SCORE, 1, data))
    srv.data_received(score_link.frame(HEDGE, 2, data))
    assert all(s.limit.inflight >= 0 for s in scorer.table.stats.values())
    if not wire.closed:
        Frames().feed(bytes(wire.out))  # whatever it wrote is well framed


def test_a_real_socket_round_trip() -> None:
    from meshd.router.remote_scoring import RemoteScoring
    from meshd.score.scorer import ScoreRequest, Status

    async def run(d: str) -> None:
        m = Mesh()
        m.node("a", rep("a:1"))
        scorer = m.scorer()
        server, counts = await score_link.serve(scorer, lambda: NOW, f"{d}/link.sock")
        remote = RemoteScoring("unix:/nonexistent", f"{d}/link.sock")
        try:
            # 50 calls in flight at once, each answered by its own reply
            many = await asyncio.gather(*(remote.score(ScoreRequest("m")) for _ in range(50)))
            admitted = [s for s in many if s.verdict.admit]
            assert counts["score"] == 50 and len(admitted) >= 4
            assert len({s.decision_id for s in admitted}) == len(admitted)
            assert all(s.verdict.reason.endswith("_limit") for s in many if not s.verdict.admit)
            for s in admitted:
                remote.report(s.decision_id, s.targets[0].replica, 0.001, Status.OK, last=True)
            for _ in range(100):
                if not scorer.decisions:
                    break
                await asyncio.sleep(0.01)
            assert not scorer.decisions and counts["reports"] == len(admitted)
        finally:
            await remote.close()
            server.close()

    d = tempfile.mkdtemp(prefix="meshd-link-")
    try:
        asyncio.run(run(d))
    finally:
        shutil.rmtree(d, ignore_errors=True)
