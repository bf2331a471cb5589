"""The sample job's collective: a ring all-reduce over TCP between a gang's ranks.

Rank ``r`` listens on port ``MESHD_COMM_PORT + r`` and connects to rank ``r + 1`` (mod
``n``) at ``MESHD_RING_ADDRS[r + 1]``; both ends check the lease token, so a rank of an older
attempt (or another job) never joins.  The vectors are small (the sample's weights), so the
all-reduce passes a running sum once around the ring and the total once more: ``2(n - 1)`` hops, the
step count of a bandwidth-optimal ring all-reduce.  A peer that does not answer within
``timeout`` seconds, or a link that cannot be set up at all (the port is taken), raises
:class:`PeerLost`: the job exits to be placed again.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time

import numpy as np

HELLO = struct.Struct("!QI")
"""Lease token, sender's rank."""
LENGTH = struct.Struct("!I")
MAX_FRAME = 1 << 26


class PeerLost(ConnectionError):
    """A neighbour in the ring went away or never came."""


class Ring:
    """This rank's two links: from the previous rank and to the next."""

    def __init__(self, rank: int, addrs: list[str], port: int, token: int,
                 timeout: float = 60.0) -> None:
        self.rank, self.n, self.token, self.timeout = rank, len(addrs), token, timeout
        self._next: socket.socket | None = None
        self._prev: socket.socket | None = None
        nxt = (rank + 1) % self.n
        deadline = time.monotonic() + timeout
        try:
            with socket.create_server(("", port + rank)) as listener:
                self._next = self._connect((addrs[nxt], port + nxt), deadline)
                self._prev = self._accept(listener, deadline)
        except OSError as exc:  # PeerLost included
            self.close()
            if isinstance(exc, PeerLost):
                raise
            raise PeerLost(f"the ring's links could not be set up: {exc}") from None

    def _connect(self, where: tuple[str, int], deadline: float) -> socket.socket:
        while True:
            try:
                sock = socket.create_connection(where, timeout=max(0.1, deadline
                                                                   - time.monotonic()))
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise PeerLost(f"rank {(self.rank + 1) % self.n} at {where[0]}:{where[1]} "
                                   f"did not come: {exc}") from None
                time.sleep(0.2)
                continue
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(self.timeout)
                sock.sendall(HELLO.pack(self.token, self.rank))
            except OSError:
                sock.close()
                raise
            return sock

    def _accept(self, listener: socket.socket, deadline: float) -> socket.socket:
        prev = (self.rank - 1) % self.n
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PeerLost(f"rank {prev} did not connect")
            listener.settimeout(left)
            try:
                sock, _ = listener.accept()
            except OSError:
                continue
            try:
                sock.settimeout(max(0.1, min(left, self.timeout)))
                token, rank = HELLO.unpack(_exact(sock, HELLO.size))
                sock.settimeout(self.timeout)
            except (OSError, PeerLost):
                sock.close()
                continue
            if token == self.token and rank == prev:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            sock.close()  # another attempt's rank, or a stranger

    def all_reduce(self, v: np.ndarray) -> np.ndarray:
        """The sum of every rank's ``v`` (float64), on every rank."""
        v = np.ascontiguousarray(v, dtype=np.float64)
        last = self.n - 1
        if self.rank == 0:
            self._send(v)
            total = self._recv()
            if self.n > 2:
                self._send(total)
            return total
        acc = self._recv() + v
        self._send(acc)
        if self.rank == last:
            return acc
        total = self._recv()
        if self.rank < last - 1:
            self._send(total)
        return total

    def _send(self, v: np.ndarray) -> None:
        data = v.tobytes()
        assert self._next is not None
        try:
            self._next.sendall(LENGTH.pack(len(data)) + data)
        except OSError as exc:
            raise PeerLost(f"rank {(self.rank + 1) % self.n} went away: {exc}") from None

    def _recv(self) -> np.ndarray:
        assert self._prev is not None
        (size,) = LENGTH.unpack(_exact(self._prev, LENGTH.size))
        if size > MAX_FRAME or size % 8:
            raise PeerLost(f"rank {(self.rank - 1) % self.n} sent a bad frame ({size} bytes)")
        return np.frombuffer(_exact(self._prev, size), dtype=np.float64).copy()

    def close(self) -> None:
        for sock in (self._next, self._prev):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()


def _exact(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        try:
            chunk = sock.recv(size - len(buf))
        except OSError as exc:
            raise PeerLost(f"link lost: {exc}") from None
        if not chunk:
            raise PeerLost("the peer closed the link")
        buf += chunk
    return bytes(buf)
