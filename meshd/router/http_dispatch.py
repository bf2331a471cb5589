"""Send one HTTP/REST inference request to the replicas' own HTTP endpoints, as it came.

Triton serves KServe v2 over HTTP itself, so the router's HTTP ingress forwards a request's
body to the chosen replica's HTTP port and hands back Triton's answer - status, body, content
type, binary-tensor header, compression - as Triton wrote it.  Nothing is converted either
way: converting to gRPC and back cost the router more than the whole bare HTTP hop
(``bench/router_overhead``), and Triton's own renderer is by definition what a client
expects.

The rules are :mod:`meshd.router.dispatch`'s: the first target, a hedge after the delay when
the scorer offers one, failover on the answers that say "this replica cannot answer now" -
no connection (UNAVAILABLE), 503, 429, and a 500 that names the replica's machinery
(:mod:`meshd.router.blame`) - and none on those that say the request is wrong, which go back
as Triton gave them; the last replica's answer goes back when every one
failed.  Outcomes are reported as they end, the last with ``last`` set.  A stateful
sequence's requests do not come here: the gateway routes those over gRPC, whose sequence
rules (:func:`~meshd.router.dispatch.dispatch_sequence`) read Triton's gRPC errors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc
from yarl import URL

from meshd.router.blame import replica_fault_http
from meshd.router.dispatch import (
    Failed,
    Failovers,
    Outcome,
    Report,
    Tally,
    _end,
    attempt_span,
)
from meshd.router.traces import RequestTrace
from meshd.score.scorer import Choice, Status

RELAYED = ("Content-Type", "Inference-Header-Content-Length", "Content-Encoding")
"""Headers of Triton's answer the client gets (aiohttp sets the length)."""
STATUS_OF = {503: Status.UNAVAILABLE, 429: Status.OVERLOADED}
"""How an error answer is reported to the scorer (any other: ERROR)."""
_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
          403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
          409: grpc.StatusCode.ABORTED, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
          499: grpc.StatusCode.CANCELLED, 501: grpc.StatusCode.UNIMPLEMENTED,
          503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}


def http_code(status: int) -> grpc.StatusCode:
    """The gRPC status an HTTP answer stands for (Triton's mapping; counters use it)."""
    return _CODES.get(status, grpc.StatusCode.INTERNAL if status >= 400 else grpc.StatusCode.OK)


@dataclass(slots=True)
class HttpReply:
    status: int
    body: bytes
    headers: dict[str, str]


class HttpUpstreams:
    """One client session for every replica's HTTP endpoint: kept-alive connections, no
    limit on how many (admission is the scorer's), replies left compressed as they come."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[tuple[str, str], URL] = {}

    def url(self, address: str, path: str) -> URL:
        """``http://address/path``, parsed once (aiohttp parses a string on every call)."""
        key = (address, path)
        url = self._urls.get(key)
        if url is None:
            if len(self._urls) >= 4096:
                self._urls.clear()
            url = self._urls[key] = URL(f"http://{address}{path}", encoded=True)
        return url

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None),
                auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None),
                skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def picked(headers: Any, names: tuple[str, ...]) -> dict[str, str]:
    """The ``names`` that ``headers`` (a multidict) has, with their values: what is forwarded
    of a request (the HTTP ingress) and relayed of an answer (a loop, not a comprehension: no
    function call per request)."""
    out = {}
    for name, value in zip(names, map(headers.get, names), strict=True):
        if value is not None:
            out[name] = value
    return out


@dataclass(slots=True)
class _Attempts:
    """What every attempt of one request shares."""

    path: str
    body: bytes
    headers: dict[str, str]
    upstreams: HttpUpstreams
    clock: Callable[[], float]
    deadline: float | None
    metadata: Sequence[tuple[str, str]]
    trace: RequestTrace | None


@dataclass(slots=True)
class _Tried:
    reply: HttpReply | None
    """Triton's answer (any status), or None: no answer (``code``, ``details`` say why)."""
    status: Status
    retry: bool
    """Another replica may answer differently: no connection, or a replica's fault."""
    code: grpc.StatusCode
    details: str
    started: float


async def _try(a: _Attempts, choice: Choice, hedge: bool) -> _Tried:
    """One attempt at ``choice``: Triton's answer, or why there is none.  The caller's
    cancellation (a client gone away) propagates."""
    started = a.clock()
    if a.deadline is not None and started >= a.deadline:
        return _Tried(None, Status.TIMEOUT, False, grpc.StatusCode.DEADLINE_EXCEEDED,
                      "deadline exceeded before the replica was tried", started)
    span, md = attempt_span(a.trace, choice, hedge, a.metadata, "triton HTTP infer")
    headers = {**a.headers, **dict(md)} if md else a.headers
    timeout = None if a.deadline is None else aiohttp.ClientTimeout(
        total=a.deadline - started)
    try:
        # Awaited directly, not as a context manager (one coroutine fewer on every resume):
        # reading the whole body gives the connection back to the pool; a failure closes it.
        resp = await a.upstreams.session().post(a.upstreams.url(choice.http, a.path),
                                                data=a.body, headers=headers, timeout=timeout)
        try:
            data = await resp.read()
        except BaseException:
            resp.close()
            raise
        reply = HttpReply(resp.status, data, picked(resp.headers, RELAYED))
    except TimeoutError:  # aiohttp's timeouts are TimeoutErrors
        _end(span, Status.TIMEOUT)
        return _Tried(None, Status.TIMEOUT, False, grpc.StatusCode.DEADLINE_EXCEEDED,
                      "deadline exceeded before the replica answered", started)
    except aiohttp.ClientError as exc:
        _end(span, Status.UNAVAILABLE, str(exc))
        return _Tried(None, Status.UNAVAILABLE, True, grpc.StatusCode.UNAVAILABLE,
                      f"replica on node {choice.node} ({choice.http}) did not answer: {exc}",
                      started)
    except asyncio.CancelledError:
        _end(span, Status.CANCELLED)
        raise
    code = reply.status
    status = Status.OK if code < 400 else STATUS_OF.get(code, Status.ERROR)
    _end(span, status, "" if status == Status.OK else f"HTTP {code}")
    return _Tried(reply, status, code >= 400 and replica_fault_http(code, reply.body),
                  http_code(code), "", started)


def _answer(tried: _Tried) -> HttpReply:
    """The client's answer after ``tried``, the request's last attempt."""
    if tried.reply is None:
        raise Failed(tried.code, tried.details)
    return tried.reply  # Triton's own, whatever its status


async def in_turn(path: str, body: bytes, headers: dict[str, str], targets: Sequence[Choice],
                  upstreams: HttpUpstreams, decision: int, post: Callable[[Outcome], None],
                  clock: Callable[[], float], deadline: float | None,
                  metadata: Sequence[tuple[str, str]], counts: Failovers,
                  trace: RequestTrace | None) -> HttpReply:
    """Forward ``body`` (``POST path`` with ``headers``) to ``targets`` (each with its
    ``http`` address) one at a time, the next only after an answer another replica may not
    give, and return the answer for the client, or raise :class:`Failed` when no replica
    answered at all.  Each attempt's outcome is posted as ``decision``'s.

    The request path of almost every HTTP request, so it is one coroutine with the attempt
    written out in place: a coroutine, a closure and a record per attempt cost the router
    about 15 us a request in place (``bench/router_overhead``, HTTP at concurrency 16), a
    quarter of everything it adds to a bare proxy."""
    session = upstreams.session()
    final = len(targets) - 1
    for i, choice in enumerate(targets):
        started = clock()
        if deadline is not None and started >= deadline:
            post((decision, "", 0.0, Status.TIMEOUT, False, True))
            raise Failed(grpc.StatusCode.DEADLINE_EXCEEDED,
                         f"deadline exceeded after trying {i} replica(s)" if i
                         else "deadline exceeded before the replica was tried")
        if i:
            counts.failovers += 1
        span, md = (None, metadata) if trace is None else attempt_span(
            trace, choice, False, metadata, "triton HTTP infer")
        sent = {**headers, **dict(md)} if md else headers
        url = upstreams.url(choice.http, path)
        try:
            # Awaited directly, not as a context manager (one coroutine fewer on every
            # resume): reading the whole body gives the connection back to the pool.
            if deadline is None:  # no timeout object to build: the session's (none) holds
                resp = await session.post(url, data=body, headers=sent)
            else:
                resp = await session.post(url, data=body, headers=sent,
                                          timeout=aiohttp.ClientTimeout(total=deadline - started))
            try:
                data = await resp.read()
            except BaseException:
                resp.close()
                raise
        except TimeoutError:  # aiohttp's timeouts are TimeoutErrors
            _end(span, Status.TIMEOUT)
            post((decision, choice.replica, clock() - started, Status.TIMEOUT, False, True))
            raise Failed(grpc.StatusCode.DEADLINE_EXCEEDED,
                         "deadline exceeded before the replica answered") from None
        except aiohttp.ClientError as exc:
            _end(span, Status.UNAVAILABLE, str(exc))
            post((decision, choice.replica, clock() - started, Status.UNAVAILABLE, False,
                  i == final))
            if i == final:
                raise Failed(grpc.StatusCode.UNAVAILABLE,
                             f"replica on node {choice.node} ({choice.http}) did not answer: "
                             f"{exc}") from None
            continue
        except asyncio.CancelledError:  # the client went away
            _end(span, Status.CANCELLED)
            post((decision, choice.replica, clock() - started, Status.CANCELLED, False, True))
            raise
        code = resp.status
        status = Status.OK if code < 400 else STATUS_OF.get(code, Status.ERROR)
        last = code < 400 or not replica_fault_http(code, data) or i == final
        if span is not None:
            _end(span, status, "" if status == Status.OK else f"HTTP {code}")
        post((decision, choice.replica, clock() - started, status, False, last))
        if last:  # Triton's own answer, whatever its status
            return HttpReply(code, data, picked(resp.headers, RELAYED))
    post((decision, "", 0.0, Status.ERROR, False, True))
    raise Failed(grpc.StatusCode.UNAVAILABLE, "no target could be tried")


async def hedged(path: str, body: bytes, headers: dict[str, str], targets: Sequence[Choice],
                 hedge_after: float, *, upstreams: HttpUpstreams, report: Report,
                 clock: Callable[[], float], deadline: float | None,
                 metadata: Sequence[tuple[str, str]], tally: Tally,
                 hedge_to: Callable[[str], Awaitable[Choice | None]] | None,
                 trace: RequestTrace | None) -> HttpReply:
    """:func:`in_turn` with a hedge: the first target, and another once it is ``hedge_after``
    late (where ``hedge_to`` names, as in :func:`~meshd.router.dispatch.dispatch`); the first
    answer that ends the request wins, the other attempt is cancelled."""
    a = _Attempts(path, body, headers, upstreams, clock, deadline, metadata, trace)
    return await _hedged(a, list(targets), hedge_after, report, tally, hedge_to)


async def _hedged(a: _Attempts, queue: list[Choice], hedge_after: float, report: Report,
                  tally: Tally,
                  hedge_to: Callable[[str], Awaitable[Choice | None]] | None) -> HttpReply:
    clock, deadline = a.clock, a.deadline
    pending: dict[asyncio.Task[_Tried], tuple[Choice, bool, float]] = {}

    def start(choice: Choice, hedge: bool) -> None:
        pending[asyncio.ensure_future(_try(a, choice, hedge))] = (choice, hedge, clock())

    def cancel_all() -> None:
        now = clock()
        for task, (choice, hedge, started) in pending.items():
            task.cancel()
            report(choice.replica, now - started, Status.CANCELLED, hedge, False)
        pending.clear()

    start(queue.pop(0), False)
    hedge_at: float | None = clock() + hedge_after
    last: _Tried | None = None
    try:
        while pending:
            now = clock()
            waits = [t - now for t in (hedge_at, deadline) if t is not None]
            done, _ = await asyncio.wait(pending, timeout=max(0.0, min(waits)) if waits
                                         else None, return_when=asyncio.FIRST_COMPLETED)
            now = clock()
            if not done:
                if deadline is not None and now >= deadline:
                    cancel_all()
                    report("", 0.0, Status.TIMEOUT, False, True)
                    raise Failed(grpc.StatusCode.DEADLINE_EXCEEDED,
                                 "deadline exceeded before any replica answered")
                if hedge_at is not None and now >= hedge_at:
                    to: Choice | None = None
                    if hedge_to is not None:
                        to = await hedge_to(next(iter(pending.values()))[0].replica)
                        if any(t.done() for t in pending):
                            continue  # answered while we asked
                        if to is None:
                            hedge_at = now + hedge_after / 2
                            continue
                    hedge_at = None
                    choice = to if to is not None else (queue.pop(0) if queue else None)
                    if choice is not None:
                        queue[:] = [c for c in queue if c.replica != choice.replica]
                        tally.hedged = True
                        start(choice, True)
                continue
            for task in done:
                choice, hedge, _ = pending.pop(task)
                tried = last = task.result()
                latency = now - tried.started
                if not tried.retry:
                    cancel_all()
                    report(choice.replica, latency, tried.status, hedge, True)
                    tally.hedge_won = hedge and tried.status == Status.OK
                    return _answer(tried)
                report(choice.replica, latency, tried.status, hedge, False)
                if queue and not pending and (deadline is None or now < deadline):
                    tally.failovers += 1
                    start(queue.pop(0), False)
        report("", 0.0, last.status if last is not None else Status.ERROR, False, True)
        if last is None:
            raise Failed(grpc.StatusCode.UNAVAILABLE, "no target could be tried")
        return _answer(last)  # the last replica's own answer
    except asyncio.CancelledError:  # the client went away
        cancel_all()
        report("", 0.0, Status.CANCELLED, False, True)
        raise
