"""Raft ports and coordinator flags for clusters whose first nodes run the Raft groups (the
consensus, tracing and training tests, and ``bench/consensus.py`` and ``bench/training.py``).

Raft ports come from 32000-32766: above the range :mod:`testbed.cluster` draws
gossip/admin/metrics ports from (so they never collide) and below Linux's ephemeral range; each
is checked free.
"""

from __future__ import annotations

import random

from meshd.dev.ports import port_free
from testbed.cluster import node_ip

RAFT_LOW, RAFT_HIGH = 32000, 32766


def pick_raft_port(ips: list[str], rng: random.Random | None = None, span: int = 2) -> int:
    """A port P with P .. P+span-1 free on every one of ``ips`` (the same ports on each IP; the
    default pair is what a coordinator's two groups listen on)."""
    rng = rng or random.Random()
    for _ in range(500):
        port = rng.randrange(RAFT_LOW, RAFT_HIGH - span + 1)
        if all(port_free(ip, port + k) for ip in ips for k in range(span)):
            return port
    raise RuntimeError(f"no {span} free Raft ports in {RAFT_LOW}..{RAFT_HIGH}")


def coordinator_args(index: int, raft_port: int, expect: int) -> list[str]:
    """The flags that make node ``index`` a coordinator of a cluster of ``expect``."""
    return ["--role", "coordinator", "--bootstrap-expect", str(expect),
            "--raft", f"{node_ip(index)}:{raft_port}"]
