"""Channels to the runtimes' KServe v2 gRPC endpoints, with byte pass-through.

The router forwards a request's bytes as the client sent them and hands back the runtime's
reply bytes unparsed: no protobuf re-encoding on the hot path (multi-megabyte tensors cost
nothing to relay beyond the copy gRPC makes anyway).  One channel per endpoint, shared by
every request to it; gRPC multiplexes calls over its HTTP/2 connection.
"""

from __future__ import annotations

from typing import Any

import grpc

SERVICE = "/inference.GRPCInferenceService/"
MAX_MESSAGE = 1 << 30
"""Bytes a relayed message may have (the router's own limit is the validator's max_bytes)."""
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    # Triton's gRPC server takes a ping at most every 5 minutes without data
    # (--grpc-http2-min-recv-ping-interval-without-data) and none without calls: more, and
    # after two strikes it closes the connection (GOAWAY "too_many_pings"), failing the calls
    # on it as UNAVAILABLE.  Pinging every 10 s, an idle router's channels were closed so
    # within the minute.  A replica that dies is found by gossip and by the deadline.
    ("grpc.keepalive_time_ms", 300_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 0),
    # A killed replica must fail fast so the request fails over, not wait out a reconnect
    # backoff that grows to minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    ("grpc.enable_retries", 0),
]


class Upstreams:
    """endpoint (``host:port``) -> a channel and its raw-bytes callables."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._unary: dict[tuple[str, str], grpc.aio.UnaryUnaryMultiCallable] = {}
        self._stream: dict[str, grpc.aio.StreamStreamMultiCallable] = {}

    def channel(self, endpoint: str) -> grpc.aio.Channel:
        ch = self._channels.get(endpoint)
        if ch is None:
            ch = self._channels[endpoint] = grpc.aio.insecure_channel(endpoint,
                                                                      options=CHANNEL_OPTIONS)
        return ch

    def unary(self, endpoint: str, method: str) -> grpc.aio.UnaryUnaryMultiCallable:
        """A callable taking and returning bytes for ``method`` (e.g. ``ModelInfer``)."""
        key = (endpoint, method)
        mc = self._unary.get(key)
        if mc is None:
            mc = self._unary[key] = self.channel(endpoint).unary_unary(SERVICE + method)
        return mc

    def stream(self, endpoint: str) -> grpc.aio.StreamStreamMultiCallable:
        mc = self._stream.get(endpoint)
        if mc is None:
            mc = self._stream[endpoint] = self.channel(endpoint).stream_stream(
                SERVICE + "ModelStreamInfer")
        return mc

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
        self._unary.clear()
        self._stream.clear()
