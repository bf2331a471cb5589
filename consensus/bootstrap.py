"""Forming and reshaping Raft groups from gossip, as Consul's ``-bootstrap-expect`` does.

Pure decisions, no I/O: the agent feeds in what gossip says about coordinators and acts on the
answer.  Why this shape:

- **Bootstrap** happens once, when ``expect`` coordinators that belong to no group see each
  other and that set has not changed for ``settle`` seconds.  All of them pick the same voters
  (the ``expect`` lowest names), so they form one group rather than several.  A coordinator not
  among them waits and is added later like any latecomer.
- **Latecomers are added by the leader** (:func:`reconcile`), as Consul's leader reconciles Serf
  members into Raft: the leader sees an alive coordinator outside the configuration and adds it;
  the newcomer starts its Raft node once it sees itself in the published configuration.  Nobody
  needs to know the leader to join.
- **A coordinator that leaves gracefully** (gossip status ``left``) is removed by the leader.
  Dead ones are kept: they may come back, and removing them would shrink the quorum under an
  outage.
- **A restart** uses the configuration saved on disk and ignores gossip.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Coordinator:
    """A coordinator as gossip describes it, for one group."""

    name: str
    address: str  # its Raft address for this group, "host:port"
    live: bool
    left: bool = False
    members: tuple[str, ...] = ()  # the configuration it publishes (empty: not in the group)


@dataclass(frozen=True)
class Start:
    """Start the Raft node with these voters (addresses, this node included)."""

    members: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Wait:
    why: str


def plan_start(me: Coordinator, expect: int, saved: Collection[str] | None,
               peers: Collection[Coordinator], stable_for: float, settle: float) -> Start | Wait:
    """What a coordinator that is not running its Raft node yet should do.

    ``saved`` is the configuration stored from a previous run (None: never was a member, or left
    gracefully).  ``stable_for`` is how long the set of unclustered live coordinators has been
    unchanged.
    """
    if saved:
        return Start(tuple(sorted({*saved, me.address})), "restart from the saved configuration")
    clustered = [p for p in peers if p.live and p.members]
    if clustered:
        newest = max(clustered, key=lambda p: (len(p.members), p.members))
        if me.address in newest.members:
            return Start(tuple(sorted(newest.members)),
                         f"added to the group by its leader (as published by {newest.name})")
        return Wait(f"the group exists ({len(newest.members)} voters); waiting for its leader "
                    "to add this node")
    if expect <= 0:
        return Wait("no group exists and --bootstrap-expect is not set")
    by_name = {p.name: p for p in peers if p.live and not p.left}
    by_name[me.name] = me
    candidates = [by_name[n] for n in sorted(by_name)]
    if len(candidates) < expect:
        return Wait(f"{len(candidates)} of {expect} coordinators seen (bootstrap-expect)")
    chosen = candidates[:expect]
    if me.name not in {c.name for c in chosen}:
        return Wait(f"{len(candidates)} coordinators for {expect} seats; this node joins later")
    if stable_for < settle:
        return Wait(f"{expect} coordinators seen; waiting {settle:g} s for the view to settle")
    return Start(tuple(sorted(c.address for c in chosen)),
                 f"bootstrap with {', '.join(c.name for c in chosen)}")


def reconcile(members: Collection[str], coordinators: Mapping[str, Coordinator]
              ) -> tuple[str, str] | None:
    """The one membership change the leader should make next (pysyncobj takes one at a time):
    ``("remove", addr)`` for a voter whose coordinator left gracefully, else ``("add", addr)``
    for a live coordinator outside the configuration, else None.  ``coordinators`` is keyed by
    Raft address."""
    current = set(members)
    for addr in sorted(current):
        c = coordinators.get(addr)
        if c is not None and c.left:
            return ("remove", addr)
    for addr, c in sorted(coordinators.items()):
        if c.live and not c.left and addr not in current:
            return ("add", addr)
    return None
