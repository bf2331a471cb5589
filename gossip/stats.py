"""Counters kept by the protocol core; the agent exports them as Prometheus metrics."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gossip.codec import DROP_REASONS


@dataclass(slots=True)
class Stats:
    packets_received: int = 0
    packets_sent: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        (*DROP_REASONS, "misdirected", "meta", *(f"stream_{r}" for r in DROP_REASONS)), 0))
    """Datagrams (and push-pull streams) dropped, by reason."""
    skipped_messages: int = 0
    """Messages of optional types this build does not know (a newer build's), skipped."""
    probes_sent: int = 0
    probes_ok: int = 0
    probes_failed: int = 0
    indirect_probes_sent: int = 0
    acks_received: int = 0
    nacks_sent: int = 0
    nacks_received: int = 0
    gossip_sent: int = 0
    suspicions_raised: int = 0
    """Suspicions this node started after a failed probe."""
    suspicions_refuted: int = 0
    """Suspected members that proved alive before their timeout."""
    refutations: int = 0
    """Times this node refuted a suspicion or death of itself."""
    conflicts: int = 0
    push_pull_started: int = 0
    push_pull_completed: int = 0
    push_pull_received: int = 0
    push_pull_failed: int = 0
    push_pull_bytes_sent: int = 0
    push_pull_bytes_received: int = 0
    probe_rtts: deque[float] = field(default_factory=lambda: deque(maxlen=4096))
    """Recent direct-probe RTTs, drained by the owner into a histogram."""

    def drop(self, reason: str, stream: bool = False) -> None:
        key = f"stream_{reason}" if stream else reason
        self.dropped[key] = self.dropped.get(key, 0) + 1
