"""Send one unary request on a decision's advice: the first target, a hedge after the delay,
failover on errors that another replica may not have, all within the deadline.

The first good answer wins; the other attempt is cancelled (its runtime stops working on it
when the cancellation reaches it).  Every attempt's outcome is reported to the scorer, the
last one with ``last`` set, which releases the decision's admission.

Which errors fail over: the replica's faults, as :mod:`meshd.router.blame` tells them -
UNAVAILABLE (not reachable, killed), RESOURCE_EXHAUSTED (it shed the request), a broken
transport, and an INTERNAL that names the replica's machinery (a dead stub, CUDA, memory).
The request's own faults - INVALID_ARGUMENT, NOT_FOUND, ..., and an INTERNAL in which the
model refuses this input - go straight back to the client: another replica would say the
same, at the cost of its time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc
from opentelemetry.trace import SpanKind

from meshd.router.blame import replica_fault
from meshd.router.traces import RequestTrace, SpanRecord
from meshd.router.upstream import Upstreams
from meshd.score.scorer import Choice, Status
from meshd.score.sequences import NOT_HELD

START_RETRY = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
"""Errors after which a sequence's START may go to the next replica: it was never taken."""
STATUS_OF = {grpc.StatusCode.UNAVAILABLE: Status.UNAVAILABLE,
             grpc.StatusCode.RESOURCE_EXHAUSTED: Status.OVERLOADED,
             grpc.StatusCode.DEADLINE_EXCEEDED: Status.TIMEOUT,
             grpc.StatusCode.CANCELLED: Status.CANCELLED}

Report = Callable[[str, float, Status, bool, bool], None]
"""``report(replica, latency, status, hedge, last)``."""
Outcome = tuple[int, str, float, Status, bool, bool]
"""``(decision id, replica, latency, status, hedge, last)``: one attempt's outcome, as a
gateway posts it for the scorer."""


class Failed(Exception):
    """Every attempt failed (or the deadline passed); carries what to tell the client."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


@dataclass(slots=True)
class Attempt:
    choice: Choice
    hedge: bool
    started: float
    call: grpc.aio.UnaryUnaryCall
    span: SpanRecord | None = None


def attempt_span(trace: RequestTrace | None, choice: Choice, hedge: bool,
                 metadata: Sequence[tuple[str, str]], name: str = "triton ModelInfer"
                 ) -> tuple[SpanRecord | None, Sequence[tuple[str, str]]]:
    """A client span for one attempt (a child of the request's), and the metadata that carries
    it to the runtime; untraced, no span and the metadata as it is."""
    if trace is None:
        return None, metadata
    attributes: dict[str, object] = {"server.address": choice.endpoint,
                                     "meshd.target": choice.node}
    if hedge:
        attributes["meshd.hedge"] = True
    span = trace.child(name, SpanKind.CLIENT, attributes)
    return span, trace.metadata(span, metadata)


def _end(span: SpanRecord | None, status: Status, details: str = "") -> None:
    if span is not None:  # OK leaves the status unset, as OTel's gRPC client spans do
        span.end("" if status == Status.OK
                 else f"{status.name}: {details}" if details else status.name)


class Failovers(Protocol):
    """Where failovers are counted: a request's :class:`Tally`, or the router's counters."""

    failovers: int


@dataclass(slots=True)
class Tally:
    """What happened to one request, for metrics."""

    hedged: bool = False
    hedge_won: bool = False
    failovers: int = 0


async def _wait(call: grpc.aio.UnaryUnaryCall) -> bytes:
    return await call  # type: ignore[no-any-return]


async def dispatch(raw: bytes, method: str, targets: Sequence[Choice], hedge_after: float,
                   *, upstreams: Upstreams, report: Report, clock: Callable[[], float],
                   deadline: float | None, metadata: Sequence[tuple[str, str]] = (),
                   tally: Tally | None = None,
                   hedge_to: Callable[[str], Awaitable[Choice | None]] | None = None,
                   trace: RequestTrace | None = None) -> bytes:
    """Relay ``raw`` (a serialized request for ``method``) and return the reply bytes, or
    raise :class:`Failed`.  ``deadline`` is absolute, on ``clock``.

    ``await hedge_to(replica)``, when given, is asked when the hedge is due, with the replica the
    request waits at: it names the target to hedge to, or None while that replica still
    answers (asked again every half ``hedge_after``).  A request late in a queue that moves
    gets little from a copy elsewhere and adds load where it hurts; one stuck behind a stall
    is what hedges are for (measured in ``bench/routing``: ungated hedges spent the budget on
    the ordinary tail at 80% load and made the p99 worse).  Without it the hedge goes to the
    next target in ``targets`` when due.

    ``trace`` (a sampled request): each attempt is a client span, and its metadata carries
    that span's trace context instead of the client's."""
    tally = tally if tally is not None else Tally()
    pending: dict[asyncio.Future[bytes], Attempt] = {}
    queue = list(targets)
    last_error: tuple[grpc.StatusCode, str] = (grpc.StatusCode.UNAVAILABLE,
                                               "no target could be tried")

    def start(hedge: bool, choice: Choice | None = None) -> None:
        if choice is None:
            choice = queue.pop(0)
        else:
            queue[:] = [c for c in queue if c.replica != choice.replica]
        now = clock()
        timeout = None if deadline is None else max(0.0, deadline - now)
        span, md = attempt_span(trace, choice, hedge, metadata)
        call = upstreams.unary(choice.endpoint, method)(raw, timeout=timeout,
                                                          metadata=md or None)
        fut: asyncio.Future[bytes] = asyncio.ensure_future(_wait(call))
        pending[fut] = Attempt(choice, hedge, now, call, span)

    def cancel_all(status: Status) -> None:
        now = clock()
        for fut, att in pending.items():
            att.call.cancel()
            fut.cancel()
            report(att.choice.replica, now - att.started, status, att.hedge, False)
            _end(att.span, status)
        pending.clear()

    if hedge_after <= 0 or len(queue) < 2:
        return await in_turn(raw, method, queue, upstreams, 0,
                             lambda outcome: report(*outcome[1:]), clock, deadline, metadata,
                             tally, trace)
    start(False)
    hedge_at: float | None = clock() + hedge_after
    try:
        while pending:
            now = clock()
            waits = [t - now for t in (hedge_at, deadline) if t is not None]
            timeout = max(0.0, min(waits)) if waits else None
            done, _ = await asyncio.wait(pending, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            now = clock()
            if not done:
                if deadline is not None and now >= deadline:
                    cancel_all(Status.TIMEOUT)
                    raise Failed(grpc.StatusCode.DEADLINE_EXCEEDED,
                                 "deadline exceeded before any replica answered")
                if hedge_at is not None and now >= hedge_at:
                    to: Choice | None = None
                    if hedge_to is not None:
                        to = await hedge_to(next(iter(pending.values())).choice.replica)
                        if any(f.done() for f in pending):
                            continue  # answered while we asked; closing gives the count back
                        if to is None:
                            hedge_at = now + hedge_after / 2
                            continue
                    hedge_at = None
                    if queue or to is not None:
                        tally.hedged = True
                        start(True, to)
                continue
            for fut in done:
                att = pending.pop(fut)
                latency = now - att.started
                exc = fut.exception()
                if exc is None:
                    cancel_all(Status.CANCELLED)
                    report(att.choice.replica, latency, Status.OK, att.hedge, True)
                    _end(att.span, Status.OK)
                    tally.hedge_won = att.hedge
                    return fut.result()
                code, details = _error(exc)
                status = STATUS_OF.get(code, Status.ERROR)
                last_error = (code, details)
                _end(att.span, status, f"{code.name}: {details}")
                if not _elsewhere(exc, code, details):
                    cancel_all(Status.CANCELLED)
                    report(att.choice.replica, latency, status, att.hedge, True)
                    raise Failed(code, details)
                report(att.choice.replica, latency, status, att.hedge, False)
                if queue and not pending and (deadline is None or now < deadline):
                    tally.failovers += 1
                    start(False)
        code, details = last_error
        report("", 0.0, STATUS_OF.get(code, Status.ERROR), False, True)
        raise Failed(code, details)  # the last replica's own words, as Triton gave them
    except asyncio.CancelledError:  # the client went away
        cancel_all(Status.CANCELLED)
        report("", 0.0, Status.CANCELLED, False, True)
        raise


@dataclass(slots=True)
class _Tried:
    """One attempt made in turn: its reply, or its error."""

    reply: bytes | None
    code: grpc.StatusCode
    details: str
    status: Status
    started: float
    span: SpanRecord | None


async def _try(raw: bytes, method: str, choice: Choice, i: int, *, upstreams: Upstreams,
               report: Report, clock: Callable[[], float], deadline: float | None,
               metadata: Sequence[tuple[str, str]], trace: RequestTrace | None) -> _Tried:
    """One attempt at ``choice`` (the ``i``-th), awaited directly: its reply or its error.  A
    deadline already past raises :class:`Failed`; a client gone away cancels the call."""
    started = clock()
    if deadline is not None and started >= deadline:
        report("", 0.0, Status.TIMEOUT, False, True)
        raise Failed(grpc.StatusCode.DEADLINE_EXCEEDED,
                     f"deadline exceeded after trying {i} replica(s)")
    span, md = attempt_span(trace, choice, False, metadata)
    call = upstreams.unary(choice.endpoint, method)(
        raw, timeout=None if deadline is None else deadline - started, metadata=md or None)
    try:
        reply: bytes = await call
    except asyncio.CancelledError:  # the client went away
        call.cancel()
        report(choice.replica, clock() - started, Status.CANCELLED, False, True)
        _end(span, Status.CANCELLED)
        raise
    except Exception as exc:  # noqa: BLE001 - classified by the caller, never swallowed
        code, details = _error(exc)
        status = STATUS_OF.get(code, Status.ERROR)
        _end(span, status, f"{code.name}: {details}")
        return _Tried(None, code, details, status, started, span)
    return _Tried(reply, grpc.StatusCode.OK, "", Status.OK, started, span)


def _answered(report: Report, clock: Callable[[], float], choice: Choice,
              tried: _Tried) -> bytes:
    """The reply of a good attempt, reported (the gateway's report does the bookkeeping once
    the reply is on its way: the client does not wait for it)."""
    report(choice.replica, clock() - tried.started, Status.OK, False, True)
    _end(tried.span, Status.OK)
    assert tried.reply is not None
    return tried.reply


async def in_turn(raw: bytes, method: str, queue: Sequence[Choice], upstreams: Upstreams,
                  decision: int, post: Callable[[Outcome], None], clock: Callable[[], float],
                  deadline: float | None, metadata: Sequence[tuple[str, str]],
                  counts: Failovers, trace: RequestTrace | None) -> bytes:
    """No hedge: one attempt at a time, the next only after a failover error, each outcome
    posted as ``decision``'s.  The request path of almost every unary request, so it is one
    coroutine with the attempt written out in place (:func:`_try` is the same attempt for
    sequences): no task, no wait set, no coroutine or record per attempt."""
    last: tuple[grpc.StatusCode, str] = (grpc.StatusCode.UNAVAILABLE,
                                         "no target could be tried")
    final = len(queue) - 1
    for i, choice in enumerate(queue):
        started = clock()
        if deadline is not None and started >= deadline:
            post((decision, "", 0.0, Status.TIMEOUT, False, True))
            raise Failed(grpc.StatusCode.DEADLINE_EXCEEDED,
                         f"deadline exceeded after trying {i} replica(s)")
        if i:
            counts.failovers += 1
        span, md = (None, metadata) if trace is None else attempt_span(trace, choice, False,
                                                                       metadata)
        call = upstreams.unary(choice.endpoint, method)(
            raw, timeout=None if deadline is None else deadline - started,
            metadata=md or None)
        try:
            reply: bytes = await call
        except asyncio.CancelledError:  # the client went away
            call.cancel()
            post((decision, choice.replica, clock() - started, Status.CANCELLED, False, True))
            _end(span, Status.CANCELLED)
            raise
        except Exception as exc:  # noqa: BLE001 - classified here, never swallowed
            code, details = _error(exc)
            status = STATUS_OF.get(code, Status.ERROR)
            _end(span, status, f"{code.name}: {details}")
            retry = _elsewhere(exc, code, details)
            post((decision, choice.replica, clock() - started, status, False,
                  not retry or i == final))
            if not retry:
                raise Failed(code, details) from None
            last = (code, details)
            continue
        # The reply goes back first; the outcome is the gateway's to report once it is.
        post((decision, choice.replica, clock() - started, Status.OK, False, True))
        if span is not None:
            _end(span, Status.OK)
        return reply
    if not queue:
        post((decision, "", 0.0, Status.ERROR, False, True))
    raise Failed(last[0], last[1])  # the last replica's own words, as Triton gave them


def _elsewhere(exc: BaseException, code: grpc.StatusCode, details: str) -> bool:
    """Whether another replica may answer differently: a replica's fault, or a failure of the
    call itself (not an answer) other than a cancellation."""
    if not isinstance(exc, grpc.aio.AioRpcError):
        return code != grpc.StatusCode.CANCELLED
    return replica_fault(code, details)


def _error(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code(), exc.details() or exc.code().name
    if isinstance(exc, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED, "cancelled"
    return grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"


async def dispatch_sequence(raw: bytes, targets: Sequence[Choice], *, walk: bool, start: bool,
                            upstreams: Upstreams, report: Report, clock: Callable[[], float],
                            deadline: float | None, metadata: Sequence[tuple[str, str]],
                            tally: Tally, trace: RequestTrace | None,
                            lost: Callable[[str], str]) -> bytes:
    """Send a request of a stateful sequence (:mod:`meshd.score.sequences`): never hedged, and
    tried elsewhere only where that cannot split the sequence's state - a START the replica
    could not take (unreachable, or it shed it), or, on a ``walk``, a replica answering that
    it does not hold the sequence (or not answering at all).  A sequence whose replica is
    unreachable mid-sequence is lost: ABORTED, with ``lost(where)`` naming it; one that no
    replica holds gets Triton's own answer for an unknown sequence."""
    final = len(targets) - 1
    unreachable: Choice | None = None
    for i, choice in enumerate(targets):
        tried = await _try(raw, "ModelInfer", choice, i, upstreams=upstreams, report=report,
                           clock=clock, deadline=deadline, metadata=metadata, trace=trace)
        if tried.reply is not None:
            return _answered(report, clock, choice, tried)
        code, details = tried.code, tried.details
        not_held = code == grpc.StatusCode.INVALID_ARGUMENT and NOT_HELD in details
        gone = code == grpc.StatusCode.UNAVAILABLE
        if gone and walk and unreachable is None:
            unreachable = choice
        if i < final and ((walk and (not_held or gone)) or (start and code in START_RETRY)):
            tally.failovers += 1
            continue  # nothing changed there: the next replica may hold or take it
        report(choice.replica, clock() - tried.started, tried.status, False, True)
        if gone and not start:
            raise Failed(grpc.StatusCode.ABORTED,
                         lost(f" on node {choice.node} ({choice.endpoint})"))
        if not_held and unreachable is not None:
            raise Failed(grpc.StatusCode.ABORTED, lost(
                f" (on node {unreachable.node}, {unreachable.endpoint}, as far as the "
                "router can tell)"))
        raise Failed(code, details)
    report("", 0.0, Status.ERROR, False, True)
    raise Failed(grpc.StatusCode.UNAVAILABLE, "no replica could take the sequence's request")
