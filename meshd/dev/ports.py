"""Free ports for the processes we start: the local dev mesh, Triton servers, tests and benches.

One copy, here in the product's dev package because ``meshd.dev`` needs it and product code
cannot import ``testbed``.  Ports a server will listen on (and may listen on again after a
restart) come from 20000-32000, below Linux's ephemeral range (32768-60999), so no outgoing
connection can be holding one; each is checked free by binding it.  :func:`free_port` is the
kernel's pick instead, for a socket bound at once or a port nothing should listen on.
"""

from __future__ import annotations

import random
import socket
import threading

PORT_LOW, PORT_HIGH = 20000, 32000
"""Listening ports are drawn from here: below Linux's ephemeral range (32768+), so outgoing
connections never hold one of them."""

_TAKEN: set[int] = set()
"""Ports :func:`pick_ports` and :func:`pick_consecutive_ports` handed out in this process."""
_LOCK = threading.Lock()


def port_free(host: str, port: int, udp: bool = False) -> bool:
    """True if ``host:port`` can be bound right now (TCP, or UDP with ``udp``)."""
    kind = socket.SOCK_DGRAM if udp else socket.SOCK_STREAM
    with socket.socket(socket.AF_INET, kind) as s:
        if not udp:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the kernel picks on ``host`` (free now; nothing listens once this returns)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports the kernel picks on ``host`` (all held until every one is had)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def pick_ports(host: str, count: int) -> list[int]:
    """``count`` TCP ports that are free on ``host`` now and not handed out before by this process.

    Random ports below the ephemeral range (so outgoing connections cannot be using them when a
    server restarts), checked by binding."""
    if count <= 0:
        return []
    with _LOCK:
        ports: list[int] = []
        for _ in range(2000):
            port = random.randrange(PORT_LOW, PORT_HIGH)
            if port in _TAKEN or port in ports or not port_free(host, port):
                continue
            ports.append(port)
            if len(ports) == count:
                _TAKEN.update(ports)
                return ports
    raise RuntimeError(f"no {count} free TCP ports on {host} in {PORT_LOW}..{PORT_HIGH}")


def pick_consecutive_ports(host: str, count: int, attempts: int = 500) -> list[int]:
    """``count`` consecutive TCP ports (``base .. base+count-1``), every one free on ``host`` now
    and none handed out before by this process; below the ephemeral range, like
    :func:`pick_ports` (for a ring whose rank ``r`` listens on ``base + r``)."""
    if count <= 0:
        return []
    with _LOCK:
        for _ in range(attempts):
            base = random.randrange(PORT_LOW, PORT_HIGH - count)
            ports = list(range(base, base + count))
            if not _TAKEN.intersection(ports) and all(port_free(host, p) for p in ports):
                _TAKEN.update(ports)
                return ports
    raise RuntimeError(f"no {count} consecutive free TCP ports on {host} in "
                       f"{PORT_LOW}..{PORT_HIGH}")


def pick_port_blocks(ips: list[str], per_node: int = 6, rng: random.Random | None = None,
                     attempts: int = 200) -> list[int]:
    """A block of ``per_node`` consecutive ports for each of ``ips``; returns each block's first
    port.  Node ``i`` gets ``base + i*per_node + k`` (all nodes on distinct ports, which also
    works when every node shares 127.0.0.1).

    Every port is checked free by binding it (UDP and TCP for the block's first, the gossip
    port)."""
    rng = rng or random.Random()
    span = per_node * len(ips)
    for _ in range(attempts):
        base = rng.randrange(PORT_LOW, PORT_HIGH - span)
        ok = True
        for i, ip in enumerate(ips):
            p = base + i * per_node
            if not (port_free(ip, p, udp=True) and all(port_free(ip, p + k)
                                                        for k in range(per_node))):
                ok = False
                break
        if ok:
            return [base + i * per_node for i in range(len(ips))]
    raise RuntimeError(f"no free port range of {span} found in {PORT_LOW}..{PORT_HIGH}")
