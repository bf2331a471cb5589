"""Wires the Vivaldi client into the agent: gossip's probe hook in, node state out.

Every direct probe ack carries the prober's peer's coordinate (``ack_payload``) and yields one
RTT sample (``probe_acked``).  Our own coordinate is also published in the node state, so every
agent learns every member's coordinate and can estimate the RTT between any two of them, not
only between itself and the peers it probes.  Pure logic driven by the agent: time is passed in.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gossip.state import Member
from topology import wire
from topology.client import VivaldiClient
from topology.config import VivaldiConfig
from topology.coordinate import Coordinate
from topology.estimate import Estimate, estimate, rtt_rows
from topology.zones import Place, ZonePriors, relation


@dataclass(frozen=True, slots=True)
class PublishPolicy:
    """When to republish our coordinate in the node state.

    Every publication is gossiped to the whole mesh, so we only republish when the coordinate
    moved enough to change estimates, and never more often than ``min_interval``.
    """

    min_interval: float = 5.0
    """Seconds between publications at most once."""
    relative_change: float = 0.05
    """Republish when the coordinate moved by this fraction of the RTT to our nearest probed
    peer (the estimates that a move distorts most, relatively) ..."""
    absolute_change: float = 50e-6
    """... or by at least this many seconds, whichever is larger."""
    error_change: float = 0.1
    """Or when our error estimate changed by this much (peers weigh us by it)."""


class CoordinatePlane:
    def __init__(self, name: str, config: VivaldiConfig | None = None, *,
                 priors: ZonePriors | None = None, policy: PublishPolicy | None = None,
                 rng: random.Random | None = None,
                 place_of: Callable[[str], Place | None] | None = None) -> None:
        self.name = name
        self.client = VivaldiClient(config, rng=rng)
        self.priors = priors or ZonePriors()
        self.policy = policy or PublishPolicy()
        self.place_of = place_of or (lambda _name: None)
        self.rejected: Counter[str] = Counter()
        """Coordinates from peers that could not be decoded, by ``wire`` reason."""
        self.estimate_errors: list[float] = []
        """Relative error of our estimate against each measured probe RTT, drained by metrics."""
        self._peers: dict[str, Coordinate] = {}
        self._payload: bytes | None = None
        self._published: Coordinate | None = None
        self._published_at = float("-inf")

    # --- gossip's ProbeHook --------------------------------------------------------------

    def ack_payload(self) -> bytes:
        if self._payload is None:
            self._payload = wire.encode(self.client.coordinate)
        return self._payload

    def probe_acked(self, member: Member, rtt: float, payload: bytes) -> None:
        coord = self._decode(payload)
        if coord is None:
            return
        self._peers[member.name] = coord
        if self.client.coordinate.is_compatible_with(coord) and rtt > 0:
            self.estimate_errors.append(abs(self.client.distance_to(coord) - rtt) / rtt)
        if self.client.update(member.name, coord, rtt) is not None:
            self._payload = None

    # --- node state ----------------------------------------------------------------------

    def learned(self, name: str, section: bytes) -> None:
        """A member published a coordinate in its node state."""
        if name != self.name:
            coord = self._decode(section)
            if coord is not None:
                self._peers[name] = coord

    def forget(self, name: str) -> None:
        """A member left or was reaped: drop its filter and coordinate."""
        self.client.forget(name)
        self._peers.pop(name, None)

    def to_publish(self, now: float) -> bytes | None:
        """Our coordinate in wire form if it should be (re)published now, else None."""
        cur = self.client.coordinate
        last = self._published
        if last is not None:
            if now - self._published_at < self.policy.min_interval:
                return None
            rtts = [r for r in map(self.client.filtered_rtt, self._peers) if r is not None]
            scale = min(rtts, default=0.0)
            moved = (math.dist(last.vec, cur.vec) + abs(last.height - cur.height)
                     + abs(last.adjustment - cur.adjustment))
            threshold = max(self.policy.absolute_change, self.policy.relative_change * scale)
            if moved < threshold and abs(last.error - cur.error) < self.policy.error_change:
                return None
        self._published, self._published_at = cur, now
        return wire.encode(cur)

    # --- queries -------------------------------------------------------------------------

    def known(self) -> int:
        """Members (other than us) whose coordinate we hold."""
        return len(self._peers)

    def coordinate_of(self, name: str) -> Coordinate | None:
        return self.client.coordinate if name == self.name else self._peers.get(name)

    def measured_rtt(self, name: str) -> float | None:
        """Median of our recent probe RTTs to ``name`` (the latency filter), if any."""
        return self.client.filtered_rtt(name)

    def estimate(self, a: str, b: str) -> Estimate:
        place_a, place_b = self.place_of(a) or Place(), self.place_of(b) or Place()
        return estimate(self.coordinate_of(a), self.coordinate_of(b),
                        relation(place_a, place_b, same_node=a == b), self.priors)

    def rtt_rows(self, names: Sequence[str]) -> list[list[float | None]]:
        """:meth:`estimate`'s RTT between every two of ``names`` (``rows[i][j]``), at once."""
        return rtt_rows([self.coordinate_of(n) for n in names],
                        [self.place_of(n) or Place() for n in names], self.priors)

    def _decode(self, data: bytes) -> Coordinate | None:
        if not data:
            self.rejected["missing"] += 1
            return None
        try:
            return wire.decode(data)
        except wire.CoordinateError as exc:
            self.rejected[exc.reason] += 1
            return None
