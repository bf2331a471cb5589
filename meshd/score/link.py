"""The score link: the score API's per-request calls (score, report, hedge) for router worker
processes, as length-prefixed protobuf frames on a Unix socket.

Why not gRPC for these: a gRPC unary call costs a Python process a few hundred microseconds
of CPU on each side, more than the scoring itself, and a worker makes one per request; the
agent, which serves every worker, would be the ceiling on the whole router (measured in
``bench/router_overhead``'s ``worker`` path).  Here a call is one ``write`` and one
``data_received`` on each side, and the messages are the score API's own
(``mesh.v1.ScoreRequest``, ``ScoreReply``, ``OutcomeBatch``, ``HedgeRequest``,
``HedgeReply``), checked by the same functions as the gRPC service's.  Everything else a
worker asks (weights, models, counters) stays on gRPC.

A frame: ``length`` (4 bytes, big-endian: what follows), ``kind`` (1 byte), ``call id``
(4 bytes), the message.  Replies carry the call's id; ``REPORT`` has none.  A request the
scorer refuses gets an ``ERROR`` frame naming the field.  A frame that cannot be read (an
unknown kind, a length beyond the bound, bytes that are not the message) is counted and
the connection is closed: after a bad frame, nothing that follows can be trusted; the
worker reconnects.

Plaintext, like the score API on a Unix socket: only processes on the host reach it, and
the socket lives in the agent's data directory.  Where asyncio has no Unix sockets (Windows)
the link is on a loopback TCP port (:func:`serve_loopback`), plaintext as the score API is
on loopback.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from google.protobuf.message import DecodeError

from meshd.score.scorer import ScoreError, Scorer
from meshd.score.service import (
    FieldError,
    apply_outcomes,
    hedge_reply,
    score_reply,
    score_request,
)
from proto.mesh.v1 import score_pb2

log = logging.getLogger("meshd.score")

SCORE, SCORED, REPORT, HEDGE, HEDGED, ERROR = 1, 2, 3, 4, 5, 6
KINDS = frozenset({SCORE, SCORED, REPORT, HEDGE, HEDGED, ERROR})
HEADER = struct.Struct(">IBI")
MAX_FRAME = 1 << 20
"""Bytes after the length field: far above any score message (a batch of 4096 reports is
about 200 KiB)."""


class FrameError(ValueError):
    """Bytes that are not a frame; the message says what was wrong."""


def frame(kind: int, call: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload) + 5, kind, call) + payload


class Frames:
    """Frames out of a byte stream (sans-I/O): feed bytes, get whole frames."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        """``(kind, call id, payload)`` of each frame completed; FrameError on a bad one."""
        buf = self._buf
        buf += data
        out = []
        pos = 0
        while len(buf) - pos >= HEADER.size:
            length, kind, call = HEADER.unpack_from(buf, pos)
            if not 5 <= length <= MAX_FRAME:
                raise FrameError(f"frame length {length} outside 5..{MAX_FRAME}")
            if kind not in KINDS:
                raise FrameError(f"unknown frame kind {kind}")
            end = pos + 4 + length
            if len(buf) < end:
                break
            out.append((kind, call, bytes(buf[pos + HEADER.size:end])))
            pos = end
        del buf[:pos]
        return out


class LinkServer(asyncio.Protocol):
    """One worker's connection, on the agent's side."""

    def __init__(self, scorer: Scorer, clock: Callable[[], float], counts: Counter[str]
                 ) -> None:
        self.scorer = scorer
        self.clock = clock
        self.counts = counts
        self.frames = Frames()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        transport = self.transport
        assert transport is not None
        try:
            frames = self.frames.feed(data)
        except FrameError as exc:
            self._malformed(str(exc))
            return
        out = []
        for kind, call, payload in frames:
            try:
                reply = self._handle(kind, call, payload)
            except DecodeError:
                self._malformed(f"frame kind {kind}: not the expected message")
                return
            except (FieldError, ScoreError) as exc:
                reply = frame(ERROR, call, str(exc).encode())
            if reply:
                out.append(reply)
        if out:
            transport.write(b"".join(out))

    def _handle(self, kind: int, call: int, payload: bytes) -> bytes:
        if kind == SCORE:
            self.counts["score"] += 1
            req = score_request(score_pb2.ScoreRequest.FromString(payload))
            scored = self.scorer.score(req, self.clock())
            return frame(SCORED, call, score_reply(scored).SerializeToString())
        if kind == REPORT:
            applied, unknown = apply_outcomes(
                self.scorer, score_pb2.OutcomeBatch.FromString(payload), self.clock())
            self.counts["reports"] += applied + unknown
            return b""
        if kind == HEDGE:
            reply = hedge_reply(self.scorer, score_pb2.HedgeRequest.FromString(payload),
                                self.clock())
            self.counts["hedge"] += 1
            return frame(HEDGED, call, reply.SerializeToString())
        raise DecodeError(f"a worker does not send kind {kind}")

    def _malformed(self, why: str) -> None:
        self.counts["malformed"] += 1
        log.warning("malformed frame on the score link; closing it", extra={
            "event": "score_link_malformed", "detail": why})
        assert self.transport is not None
        self.transport.close()


async def serve(scorer: Scorer, clock: Callable[[], float], path: str
                ) -> tuple[asyncio.Server, Counter[str]]:
    """Serve the link on the Unix socket ``path``; returns the server and its counts
    (``score``, ``reports``, ``malformed``)."""
    Path(path).unlink(missing_ok=True)
    counts: Counter[str] = Counter()
    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(lambda: LinkServer(scorer, clock, counts), path)
    return server, counts


async def serve_loopback(scorer: Scorer, clock: Callable[[], float]
                         ) -> tuple[asyncio.Server, Counter[str], str]:
    """:func:`serve` on a loopback TCP port instead, for platforms whose event loop has no
    Unix sockets (Windows): the server, its counts and its address, ``tcp:127.0.0.1:PORT``
    (what :class:`meshd.router.remote_scoring.RemoteScoring` takes).  Plaintext on loopback,
    as the score API is by default."""
    counts: Counter[str] = Counter()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: LinkServer(scorer, clock, counts), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, counts, f"tcp:127.0.0.1:{port}"
