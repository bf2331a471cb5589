"""mTLS gRPC channels from this agent to its peers' admin ports, one per target.

Shared by the control plane (forwarding, following the log) and the signal plane
(subscriptions): each channel pins the peer's node name, reconnects quickly, and is replaced
when our own certificate is renewed so new connections never present an expired one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from certs import tls
from certs.identity import Identity
from certs.spiffe import SpiffeId

PEER_CHANNEL_OPTIONS: list[tuple[str, object]] = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.min_reconnect_backoff_ms", 1000),
]
"""gRPC's defaults (1 s growing to 120 s between connection attempts) would keep a restarted
peer unused for minutes; a coordinator is back within seconds or is gone."""


class PeerChannels:
    def __init__(self, identity: Callable[[], Identity]) -> None:
        self.identity = identity
        self._channels: dict[str, tuple[Identity, grpc.aio.Channel]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def get(self, name: str, target: str) -> grpc.aio.Channel:
        """The channel to node ``name`` at ``target`` (created, or renewed with our cert)."""
        ident = self.identity()
        cached = self._channels.get(target)
        if cached is None or cached[0] is not ident:
            if cached is not None:
                task = asyncio.get_running_loop().create_task(cached[1].close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
            td = ident.spiffe_id.trust_domain
            channel = tls.grpc_channel(target, ident, aio=True,
                                       server_name=SpiffeId.node(td, name).dns_names()[0],
                                       options=PEER_CHANNEL_OPTIONS)
            cached = (ident, channel)
            self._channels[target] = cached
        return cached[1]

    async def close(self) -> None:
        for _, channel in self._channels.values():
            await channel.close()
        self._channels.clear()
