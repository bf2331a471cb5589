"""The Score gRPC service: round trips, field errors, WatchTargets, and fuzzed inputs."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshd.score import link as score_link
from meshd.score import service as score_api
from meshd.score.scorer import Choice, ScoreError, Status
from proto.mesh.v1 import score_pb2, score_pb2_grpc
from tests.test_score import NOW, Mesh, rep


@pytest.fixture
def mesh() -> Mesh:
    m = Mesh()
    m.node("a", rep("a:1", spu=0.001))
    m.node("b", rep("b:1", spu=0.003))
    return m


async def _serve(mesh: Mesh, addr: Any = ("127.0.0.1", 0)) -> tuple[Any, str, Any]:
    scorer = mesh.scorer()
    server, where = await score_api.serve(scorer, lambda: NOW, addr, lambda: None)
    return server, where, scorer


def test_score_report_admit_round_trip(mesh: Mesh) -> None:
    async def run() -> None:
        server, where, scorer = await _serve(mesh)
        try:
            async with grpc.aio.insecure_channel(where) as ch:
                stub = score_pb2_grpc.ScoreStub(ch)
                reply = await stub.ScoreTargets(score_pb2.ScoreRequest(
                    model="m", payload_bytes=100, idempotent=True))
                assert reply.verdict.admit and reply.decision_id > 0
                assert [t.endpoint for t in reply.targets][0] == "a:1"
                t = reply.targets[0]
                assert t.predicted_seconds == pytest.approx(
                    t.rtt_seconds + t.queue_seconds + t.service_seconds)
                ack = await stub.ReportOutcome(score_pb2.OutcomeReport(
                    decision_id=reply.decision_id, replica=t.replica, latency_seconds=0.002,
                    status=score_pb2.OUTCOME_OK, last=True))
                assert ack.known
                assert not (await stub.ReportOutcome(score_pb2.OutcomeReport(
                    decision_id=reply.decision_id, last=True))).known
                adm = await stub.Admit(score_pb2.AdmitRequest(model="m"))
                assert adm.verdict.admit and adm.decision_id
                none = await stub.ScoreTargets(score_pb2.ScoreRequest(model="zzz"))
                assert not none.verdict.admit and none.verdict.reason == "no_targets"
        finally:
            await server.stop(0)
    asyncio.run(run())


def test_targets_carry_the_http_address_both_ways() -> None:
    """``Choice.http`` survives the wire to a router worker; without one the target encodes
    as it did before the field (proto3 leaves an empty string out)."""
    c = Choice("a", "a:8001", "a:8001/m/1", "1", "z1", 0.3, 0.1, 0.1, 0.1, http="a:8000")
    t = score_pb2.Target.FromString(score_api.target_pb(c).SerializeToString())
    assert t.http_endpoint == "a:8000" and score_api.choice_of(t) == c
    plain = dataclasses.replace(c, http="")
    assert score_api.choice_of(score_api.target_pb(plain)) == plain
    old = score_pb2.Target(node="a", endpoint="a:8001", replica="a:8001/m/1", version="1",
                           predicted_seconds=0.3, rtt_seconds=0.1, queue_seconds=0.1,
                           service_seconds=0.1, zone="z1")
    assert score_api.target_pb(plain).SerializeToString() == old.SerializeToString()


def test_a_replica_with_http_is_scored_with_its_address() -> None:
    m = Mesh()
    m.node("a", dataclasses.replace(rep("a:1", spu=0.001), http="a:8000"))
    m.node("b", rep("b:1", spu=0.003))

    async def run() -> None:
        server, where, _ = await _serve(m)
        try:
            async with grpc.aio.insecure_channel(where) as ch:
                reply = await score_pb2_grpc.ScoreStub(ch).ScoreTargets(
                    score_pb2.ScoreRequest(model="m", payload_bytes=100, idempotent=True))
            by_endpoint = {t.endpoint: score_api.choice_of(t).http for t in reply.targets}
            assert by_endpoint == {"a:1": "a:8000", "b:1": ""}
        finally:
            await server.stop(0)
    asyncio.run(run())


def test_a_unix_socket_serves_too(mesh: Mesh, tmp_path: Any) -> None:
    async def run() -> None:
        path = str(tmp_path / "score.sock")
        server, where, _ = await _serve(mesh, path)
        try:
            async with grpc.aio.insecure_channel(where) as ch:
                reply = await score_pb2_grpc.ScoreStub(ch).ScoreTargets(
                    score_pb2.ScoreRequest(model="m"))
                assert reply.verdict.admit
        finally:
            await server.stop(0)
    asyncio.run(run())


@pytest.mark.parametrize("request_, field", [
    (score_pb2.ScoreRequest(model=""), "model"),
    (score_pb2.ScoreRequest(model="m", deadline_seconds=math.nan), "deadline_seconds"),
    (score_pb2.ScoreRequest(model="m", deadline_seconds=-1), "deadline_seconds"),
    (score_pb2.ScoreRequest(model="m", slo_class="nope"), "slo_class"),
    (score_pb2.ScoreRequest(model="m", tenant="x\n"), "tenant"),
    (score_pb2.ScoreRequest(model="m", exclude=["e"] * 65), "exclude"),
    (score_pb2.OutcomeReport(status=99), "status"),
    (score_pb2.OutcomeReport(latency_seconds=math.inf), "latency_seconds"),
    (score_pb2.AdmitRequest(model="m" * 300), "model"),
    (score_pb2.WatchRequest(model=""), "model"),
])
def test_bad_fields_are_invalid_argument_naming_the_field(mesh: Mesh, request_: Any,
                                                          field: str) -> None:
    async def run() -> None:
        server, where, _ = await _serve(mesh)
        try:
            async with grpc.aio.insecure_channel(where) as ch:
                stub = score_pb2_grpc.ScoreStub(ch)
                method = {score_pb2.ScoreRequest: stub.ScoreTargets,
                          score_pb2.OutcomeReport: stub.ReportOutcome,
                          score_pb2.AdmitRequest: stub.Admit}.get(type(request_))
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    if method is None:
                        async for _ in stub.WatchTargets(request_):
                            pass
                    else:
                        await method(request_)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert field in (err.value.details() or "")
        finally:
            await server.stop(0)
    asyncio.run(run())


def test_watch_targets_streams_weights_and_changes(mesh: Mesh) -> None:
    async def run() -> None:
        server, where, _ = await _serve(mesh)
        try:
            async with grpc.aio.insecure_channel(where) as ch:
                stream: AsyncIterator[Any] = score_pb2_grpc.ScoreStub(ch).WatchTargets(
                    score_pb2.WatchRequest(model="m"))
                first = await anext(aiter(stream))
                w = {t.target.endpoint: t.weight for t in first.targets}
                assert sum(w.values()) == pytest.approx(1) and w["a:1"] > w["b:1"]
                mesh.node("c", rep("c:1", spu=0.0001))  # a much faster replica appears
                second = await asyncio.wait_for(anext(aiter(stream)), 5)
                assert {t.target.endpoint for t in second.targets} == {"a:1", "b:1", "c:1"}
        finally:
            await server.stop(0)
    asyncio.run(run())


def test_a_non_loopback_address_is_served_with_mtls_only(mesh: Mesh) -> None:
    """The score API never serves plaintext beyond loopback: off-host it needs an identity
    (here: none to present, so binding must fail rather than fall back to plaintext)."""
    async def run() -> None:
        with pytest.raises(Exception):  # noqa: B017 - any failure, as long as it is not served
            await _serve(mesh, ("0.0.0.0", 0))
    asyncio.run(run())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_fuzzed_score_requests_get_a_verdict_or_a_field_error(data: bytes) -> None:
    """Whatever bytes arrive as a ScoreRequest: a decode error (gRPC answers INTERNAL before
    our code), a field error naming the field, or a scored reply; never another exception."""
    m = Mesh()
    m.node("a", rep("a:1"))
    scorer = m.scorer()
    try:
        msg = score_pb2.ScoreRequest.FromString(data)
    except DecodeError:
        return
    try:
        out = scorer.score(score_api.score_request(msg), NOW)
    except (score_api.FieldError, ScoreError) as exc:
        assert ":" in str(exc)
        return
    assert out.verdict.admit or out.verdict.reason


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=120))
def test_fuzzed_outcome_reports_never_break_the_scorer(data: bytes) -> None:
    m = Mesh()
    m.node("a", rep("a:1"))
    scorer = m.scorer()
    out = scorer.score(score_api.score_request(score_pb2.ScoreRequest(model="m")), NOW)
    try:
        msg = score_pb2.OutcomeReport.FromString(data)
        status = Status(msg.status)
    except (DecodeError, ValueError):
        return
    scorer.report(msg.decision_id % (out.decision_id + 2), msg.replica, msg.latency_seconds,
                  status, NOW, hedge=msg.hedge, last=msg.last)
    assert all(s.limit.inflight >= 0 for s in scorer.table.stats.values())


# --- what router worker processes use ----------------------------------------------------------


def test_outcome_batches_are_applied_whole_or_refused_naming_the_report(mesh: Mesh) -> None:
    async def run() -> None:
        server, where, scorer = await _serve(mesh)
        try:
            async with grpc.aio.insecure_channel(where) as ch:
                stub = score_pb2_grpc.ScoreStub(ch)
                dids = [(await stub.ScoreTargets(score_pb2.ScoreRequest(model="m"))).decision_id
                        for _ in range(3)]
                assert len(scorer.decisions) == 3

                async def batches() -> AsyncIterator[score_pb2.OutcomeBatch]:
                    for did in dids[:2]:
                        yield score_pb2.OutcomeBatch(reports=[score_pb2.OutcomeReport(
                            decision_id=did, replica="a:1/m/1", latency_seconds=0.002,
                            last=True)])
                    yield score_pb2.OutcomeBatch(reports=[score_pb2.OutcomeReport(
                        decision_id=999, last=True)])
                ack = await stub.ReportOutcomes(batches())
                assert (ack.applied, ack.unknown) == (2, 1)
                assert [d for d in dids if scorer.decisions.get(d)] == [dids[2]]
                outcomes = dict(scorer.counters.outcomes)

                async def bad() -> AsyncIterator[score_pb2.OutcomeBatch]:
                    yield score_pb2.OutcomeBatch(reports=[
                        score_pb2.OutcomeReport(decision_id=dids[2], last=True),
                        score_pb2.OutcomeReport(decision_id=dids[2], latency_seconds=-1)])
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.ReportOutcomes(bad())
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "reports[1].latency_seconds" in (err.value.details() or "")
                # nothing of the refused batch was applied
                assert [d for d in dids if scorer.decisions.get(d)] == [dids[2]]
                assert dict(scorer.counters.outcomes) == outcomes
        finally:
            await server.stop(0)
    asyncio.run(run())


def test_hedge_target_models_and_router_counters(mesh: Mesh) -> None:
    async def run() -> None:
        from meshd.router.counters import WorkerCounters

        workers = WorkerCounters()
        scorer = mesh.scorer()
        server, where = await score_api.serve(scorer, lambda: NOW, ("127.0.0.1", 0),
                                              lambda: None, workers)
        try:
            async with grpc.aio.insecure_channel(where) as ch:
                stub = score_pb2_grpc.ScoreStub(ch)
                reply = await stub.ScoreTargets(score_pb2.ScoreRequest(model="m"))
                # the first target answers (nothing was sent to it yet): no hedge now
                hedge = await stub.HedgeTarget(score_pb2.HedgeRequest(
                    decision_id=reply.decision_id, replica=reply.targets[0].replica))
                assert not hedge.found
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.HedgeTarget(score_pb2.HedgeRequest(decision_id=1))
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "replica" in (err.value.details() or "")

                listed = await stub.ListModels(score_pb2.ListModelsRequest())
                assert [(m.model, m.version, m.ready) for m in listed.models] == [
                    ("m", "1", True)]

                for n in (3, 5):  # a later report of the same life replaces the earlier
                    await stub.ReportRouterCounters(score_pb2.RouterCounters(
                        worker="w/1", requests=n, completed=n, failed={"UNAVAILABLE": 1}))
                await stub.ReportRouterCounters(score_pb2.RouterCounters(
                    worker="w/2", requests=2, shed={"target_limit": 2}))
                total = workers.total()
                assert (total.requests, total.completed) == (7, 5)
                assert total.failed == {"UNAVAILABLE": 1} and total.shed == {"target_limit": 2}
                for bad, field in ((score_pb2.RouterCounters(), "worker"),
                                   (score_pb2.RouterCounters(worker="w", failed={"\n": 1}),
                                    "failed key"),
                                   (score_pb2.RouterCounters(worker="w", requests=1 << 63),
                                    "counters")):
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await stub.ReportRouterCounters(bad)
                    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert field in (err.value.details() or "")
                assert workers.total().requests == 7
        finally:
            await server.stop(0)
    asyncio.run(run())


def test_worker_counters_stay_monotonic_past_the_bound_of_lives() -> None:
    from meshd.router.counters import MAX_LIVES, RouterCounters, WorkerCounters

    w = WorkerCounters()
    for i in range(MAX_LIVES + 10):
        w.update(f"life-{i}", RouterCounters(requests=1, shed={"deadline": 1}))
    assert len(w.lives) == MAX_LIVES
    total = w.total(RouterCounters(requests=5))
    assert total.requests == MAX_LIVES + 10 + 5 and total.shed == {"deadline": MAX_LIVES + 10}


def test_remote_scoring_over_a_unix_socket(mesh: Mesh) -> None:
    """What a router worker sees of the agent's scorer: scores, batched outcomes that close
    the decisions, weights, models, field errors as ScoreError, and a gone agent as
    ScoringUnavailable."""
    import tempfile

    from meshd.router.remote_scoring import RemoteScoring
    from meshd.router.scoring import ScoringUnavailable
    from meshd.score.scorer import ScoreRequest

    async def run(d: str) -> None:
        scorer = mesh.scorer()
        server, where = await score_api.serve(scorer, lambda: NOW, f"{d}/score.sock",
                                              lambda: None)
        link, counts = await score_link.serve(scorer, lambda: NOW, f"{d}/link.sock")
        remote = RemoteScoring(where, f"{d}/link.sock")
        try:
            scored = [await remote.score(ScoreRequest("m", payload_bytes=10)) for _ in range(20)]
            assert all(s.verdict.admit for s in scored)
            assert scored[0].targets[0].endpoint == "a:1" and scored[0].targets[0].predicted > 0
            assert len(scorer.decisions) == 20
            for s in scored:
                remote.report(s.decision_id, s.targets[0].replica, 0.002, Status.OK, last=True)
            for _ in range(100):
                if not scorer.decisions:
                    break
                await asyncio.sleep(0.02)
            assert not scorer.decisions and scorer.counters.outcomes["OK"] == 20
            assert await remote.hedge_target(scored[0].decision_id, "a:1/m/1") is None
            weights = await remote.weights("m", "")
            assert {c.endpoint for c, _ in weights} == {"a:1", "b:1"}
            assert sum(w for _, w in weights) == pytest.approx(1)
            assert await remote.weights("nope", "") == []
            assert await remote.models() == {("m", "1"): True}
            with pytest.raises(ScoreError) as err:
                await remote.score(ScoreRequest("m" * 300))
            assert err.value.field == "model"
            assert (counts["score"], counts["reports"], counts["malformed"]) == (21, 20, 0)
            # the link breaks and nothing listens (the agent restarting): calls fail fast;
            # once it listens again, the next call reconnects
            link.close()
            assert remote._link is not None and remote._link.transport is not None
            remote._link.transport.close()
            await asyncio.sleep(0.05)
            with pytest.raises(ScoringUnavailable):
                await remote.score(ScoreRequest("m"))
            link, counts = await score_link.serve(scorer, lambda: NOW, f"{d}/link.sock")
            assert (await remote.score(ScoreRequest("m"))).verdict.admit
        finally:
            await server.stop(0)
            link.close()
        with pytest.raises(ScoringUnavailable):
            await remote.models()
        await remote.close()

    d = tempfile.mkdtemp(prefix="meshd-test-")
    try:
        asyncio.run(run(d))
    finally:
        import shutil
        shutil.rmtree(d, ignore_errors=True)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_fuzzed_outcome_batches_and_router_counters_are_checked(data: bytes) -> None:
    """Any bytes as an OutcomeBatch or RouterCounters: a decode error, a field error naming
    the field, or checked values; never another exception."""
    for kind in (score_pb2.OutcomeBatch, score_pb2.RouterCounters):
        try:
            msg = kind.FromString(data)
        except DecodeError:
            continue
        try:
            if isinstance(msg, score_pb2.OutcomeBatch):
                for i, r in enumerate(msg.reports):
                    replica, latency, status = score_api.outcome(r, f"reports[{i}].")
                    assert latency >= 0 and isinstance(status, Status)
            else:
                worker, counters = score_api.router_counters(msg)
                assert worker and counters.requests <= score_api.MAX_COUNT
        except score_api.FieldError as exc:
            assert ":" in str(exc)
