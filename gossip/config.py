"""Protocol configuration for the SWIM + Lifeguard core.

The defaults are HashiCorp memberlist's (``DefaultLANConfig``, ``DefaultWANConfig``,
``DefaultLocalConfig``): they are well studied in production (Consul, Nomad, Serf), so we start
from them and only deviate where a field says why.  Every duration is in seconds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from gossip.codec import MAX_BLOB, MAX_META


@dataclass(frozen=True, slots=True)
class Config:
    """Timing and sizing of the membership protocol.

    Build one with :meth:`lan`, :meth:`wan` or :meth:`local` and override fields with
    :meth:`replace`; the class defaults are the LAN profile.
    """

    profile: str = "lan"
    """Name of the profile these values came from (reported, not interpreted)."""

    probe_interval: float = 1.0
    """Time between failure-detection probes of one random member.  Lower detects failures
    faster at the cost of bandwidth.  Scaled by Lifeguard's health score (see ``awareness``)."""

    probe_timeout: float = 0.5
    """How long to wait for a direct ack before asking ``indirect_checks`` peers to probe.
    Should be around the 99th percentile of RTT on the network."""

    indirect_checks: int = 3
    """Members asked to probe a target on our behalf after a direct probe fails; guards
    against a single congested path falsely accusing a node."""

    retransmit_mult: int = 4
    """A broadcast is sent ``retransmit_mult * max(2, ceil(log10(N+1)))`` times, which delivers
    it to everyone with high probability in O(log N) rounds (memberlist has no floor of 2; see
    ``broadcast.retransmit_limit``)."""

    suspicion_mult: int = 4
    """Minimum suspicion timeout is ``suspicion_mult * max(1, log10(N)) * probe_interval``.
    Also sets the expected number of independent confirmations, ``suspicion_mult - 2``."""

    suspicion_max_timeout_mult: int = 6
    """Lifeguard: a fresh suspicion starts at ``suspicion_max_timeout_mult`` times the minimum
    timeout and shrinks towards the minimum as independent confirmations arrive.  1 disables the
    dynamic timeout (plain SWIM)."""

    awareness_max_multiplier: int = 8
    """Lifeguard local health: the health score ranges 0..multiplier-1 and probe intervals and
    timeouts are scaled by ``score + 1``, so a node that is itself slow (CPU-starved, dropping
    packets) probes less aggressively instead of accusing healthy peers.  1 disables it."""

    nacks: bool = True
    """Lifeguard: indirect probers send a nack when the target does not answer, so the
    requester can tell "target is down" from "my own network is down"."""

    gossip_interval: float = 0.2
    """Time between gossip rounds that send queued broadcasts to ``gossip_nodes`` members."""

    gossip_nodes: int = 3
    """Random members each gossip round sends to."""

    gossip_to_the_dead_time: float = 30.0
    """Keep gossiping to a dead member for this long, so that a node we wrongly declared dead
    learns it and refutes."""

    push_pull_interval: float = 30.0
    """Full state exchange with one random member (anti-entropy).  Scaled up above 32 members
    (``push_pull_scale``) so the cluster-wide TCP load stays bounded.  0 disables it."""

    tcp_timeout: float = 10.0
    """Deadline for one push-pull exchange over TCP, connect included."""

    packet_size: int = 1400
    """Largest UDP payload we build (the safe MTU for most networks, tunnels included)."""

    dead_node_reclaim_time: float = 0.0
    """How long a dead or left member's name stays bound to its address.  0 means a member
    that is dead or left may come back at a new address at once; alive members never change
    address silently (that is a name conflict)."""

    reap_time: float = 24 * 3600.0
    """Forget dead and left members after this long (Serf's reconnect/tombstone timeout), so
    ``members`` still shows recent failures to operators."""

    max_meta_bytes: int = 1024
    """Upper bound on the encoded node metadata (roles, zone, ports, tags) carried with alive."""

    max_state_bytes: int = 65536
    """Upper bound on one node's published state blob (carried in full by push-pull)."""

    max_state_delta_bytes: int = 1024
    """State updates up to this size also ride the broadcast queue; larger ones spread whole by
    push-pull only, and their owner's delta (``Swim.publish_state``) rides in their place when
    it fits."""

    max_stream_bytes: int = 32 * 1024 * 1024
    """Largest push-pull payload accepted (10,000 members with metadata fit easily)."""

    leave_propagate_delay: float = 1.0
    """How long a leaving node keeps gossiping its ``left`` message before it stops."""

    @classmethod
    def lan(cls, **overrides: Any) -> Config:
        """memberlist ``DefaultLANConfig``: a local network, RTT well under probe_timeout."""
        return cls(profile="lan").replace(**overrides)

    @classmethod
    def wan(cls, **overrides: Any) -> Config:
        """memberlist ``DefaultWANConfig``: higher latency, slower and more tolerant probing."""
        return cls(
            profile="wan",
            tcp_timeout=30.0,
            suspicion_mult=6,
            push_pull_interval=60.0,
            probe_timeout=3.0,
            probe_interval=5.0,
            gossip_nodes=4,
            gossip_interval=0.5,
            gossip_to_the_dead_time=60.0,
        ).replace(**overrides)

    @classmethod
    def local(cls, **overrides: Any) -> Config:
        """memberlist ``DefaultLocalConfig``: loopback or one host; fast and chatty."""
        return cls(
            profile="local",
            tcp_timeout=1.0,
            indirect_checks=1,
            retransmit_mult=2,
            suspicion_mult=3,
            push_pull_interval=15.0,
            probe_timeout=0.2,
            probe_interval=1.0,
            gossip_interval=0.1,
            gossip_to_the_dead_time=15.0,
        ).replace(**overrides)

    @classmethod
    def profile_named(cls, name: str, **overrides: Any) -> Config:
        """The profile called ``name`` (``lan``, ``wan`` or ``local``)."""
        factories = {"lan": cls.lan, "wan": cls.wan, "local": cls.local}
        try:
            factory = factories[name]
        except KeyError:
            raise ValueError(
                f"unknown profile {name!r}; expected one of {sorted(factories)}") from None
        return factory(**overrides)

    def replace(self, **overrides: Any) -> Config:
        """A copy with ``overrides`` applied and validated."""
        cfg = dataclasses.replace(self, **overrides) if overrides else self
        cfg.validate()
        return cfg

    def without_lifeguard(self) -> Config:
        """Plain SWIM: fixed suspicion timeout, no health awareness, no nacks (for comparison)."""
        return self.replace(suspicion_max_timeout_mult=1, awareness_max_multiplier=1, nacks=False)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field that cannot work."""
        positive = ("probe_interval", "probe_timeout", "gossip_interval", "tcp_timeout")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.probe_timeout > self.probe_interval:
            raise ValueError("probe_timeout must not exceed probe_interval")
        for name in ("retransmit_mult", "suspicion_mult", "suspicion_max_timeout_mult",
                     "awareness_max_multiplier"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("indirect_checks", "gossip_nodes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.push_pull_interval < 0:
            raise ValueError("push_pull_interval must be >= 0 (0 disables)")
        if not 576 <= self.packet_size <= 65000:
            raise ValueError(f"packet_size must be in [576, 65000], got {self.packet_size}")
        for name in ("gossip_to_the_dead_time", "dead_node_reclaim_time", "reap_time",
                     "leave_propagate_delay"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        # Larger values than the wire format carries would make peers drop every alive (or
        # push-pull) of this node as malformed.
        if not 0 <= self.max_meta_bytes <= MAX_META:
            raise ValueError(
                f"max_meta_bytes must be in [0, {MAX_META}], got {self.max_meta_bytes}")
        if not 0 <= self.max_state_bytes <= MAX_BLOB:
            raise ValueError(
                f"max_state_bytes must be in [0, {MAX_BLOB}], got {self.max_state_bytes}")
        if self.max_stream_bytes <= 0:
            raise ValueError(f"max_stream_bytes must be > 0, got {self.max_stream_bytes}")
