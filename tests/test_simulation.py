"""Deterministic whole-cluster tests: many ``Swim`` cores on the simulated network.

Every test runs on a virtual clock with seeded loss and latency, so a failure reproduces exactly
(same seed, same event log).  Sizes are kept small so the file runs in seconds; the large runs
live in ``bench/gossip_sim.py``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import pytest

from gossip.config import Config
from gossip.events import EventKind, MemberEvent
from gossip.state import Status
from gossip.suspicion import suspicion_timeout
from testbed.sim.network import STARVE_PHASES, SimNetwork

LAN = Config.lan()


class Log:
    """Every event of every node, in order, as ``(time, observer, kind, member, incarnation)``."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, EventKind, str, int]] = []

    def __call__(self, observer: str, ev: MemberEvent) -> None:
        self.events.append((ev.at, observer, ev.kind, ev.member.name, ev.member.incarnation))

    def of(self, kind: EventKind, member: str | None = None) -> list[tuple[float, str]]:
        return [(t, o) for t, o, k, m, _ in self.events
                if k == kind and (member is None or m == member)]

    def observers(self, kind: EventKind, member: str) -> set[str]:
        return {o for _, o in self.of(kind, member)}


def views(net: SimNetwork, member: str, observers: Iterable[str]) -> Counter[Status | None]:
    return Counter(net.view(o, member) for o in observers)


def all_see(net: SimNetwork, member: str, status: Status, observers: Iterable[str]) -> bool:
    return all(net.view(o, member) == status for o in observers)


def fully_converged(net: SimNetwork, names: list[str]) -> bool:
    return all(net.view(o, m) == Status.ALIVE for o in names for m in names)


def min_suspicion(cfg: Config, n: int) -> float:
    return suspicion_timeout(cfg.suspicion_mult, n, cfg.probe_interval)


# --- join --------------------------------------------------------------------------------------

def test_fifty_nodes_join_one_by_one_through_a_seed_and_converge() -> None:
    log = Log()
    net = SimNetwork(LAN, seed=11, on_event=log)
    names = [f"n{i}" for i in range(50)]
    net.add_node(names[0])
    for name in names[1:]:
        net.add_node(name, join=[names[0]])
        net.run_until(net.now + 0.25)
    # Gossip spreads each join within a few rounds.  In a small cluster an alive is sent only
    # 4-8 times per member, so now and then one member misses one: push-pull repairs that.
    net.run_until(net.now + 3.0)
    pairs = [net.view(o, m) == Status.ALIVE for o in names for m in names]
    assert sum(pairs) >= 0.99 * len(pairs)
    net.run_until(net.now + 120.0, stop=lambda: fully_converged(net, names))
    assert fully_converged(net, names), {o: len(net.nodes[o].swim.members()) for o in names}
    for name in names:
        assert net.nodes[name].swim.num_live() == 50
    assert len(log.of(EventKind.JOIN)) == 50 * 49
    assert not log.of(EventKind.SUSPECT) and not log.of(EventKind.FAILED)


# --- failure detection -------------------------------------------------------------------------

def test_killed_node_is_declared_dead_by_all_within_the_bound_despite_loss() -> None:
    log = Log()
    net = SimNetwork(LAN, seed=3, loss=0.01, on_event=log)
    names = net.add_cluster(60)
    net.run_until(5.0)
    victim = "n17"
    live = [n for n in names if n != victim]
    killed_at = net.now
    net.kill(victim)
    # The bound holds with high probability, not always: with round-robin probing the chance
    # that nobody probes the victim for k intervals is about e^-k.
    bound = min_suspicion(LAN, 60) + 5 * LAN.probe_interval
    net.run_until(killed_at + 60.0,
                  stop=lambda: len(log.observers(EventKind.FAILED, victim)) == len(live))
    assert log.observers(EventKind.FAILED, victim) == set(live)
    last = max(t for t, _ in log.of(EventKind.FAILED, victim))
    assert last - killed_at <= bound, (last - killed_at, bound)
    # Nobody else was hurt by the 1% loss.
    assert {m for _, _, k, m, _ in log.events if k == EventKind.FAILED} == {victim}


def test_graceful_leave_is_seen_as_left_not_dead() -> None:
    log = Log()
    net = SimNetwork(LAN, seed=5, loss=0.01, on_event=log)
    names = net.add_cluster(40)
    net.run_until(3.0)
    net.leave("n9")
    others = [n for n in names if n != "n9"]
    net.run_until(net.now + 30.0)  # well past any suspicion timeout
    assert not net.nodes["n9"].up
    assert views(net, "n9", others) == Counter({Status.LEFT: len(others)})
    assert log.observers(EventKind.LEFT, "n9") == set(others)
    assert not log.of(EventKind.FAILED) and not log.of(EventKind.SUSPECT)


# --- stalls (a SIGSTOPped process) -------------------------------------------------------------

def test_long_stall_is_declared_dead_then_refutes_and_returns() -> None:
    log = Log()
    net = SimNetwork(LAN, seed=7, loss=0.01, on_event=log)
    names = net.add_cluster(30)
    net.run_until(2.0)
    victim = "n4"
    others = [n for n in names if n != victim]
    stall = 6 * min_suspicion(LAN, 30)  # beyond even an unconfirmed Lifeguard suspicion
    net.stall(victim, stall)
    resume = net.now + stall
    net.run_until(resume - 0.01)
    assert log.observers(EventKind.FAILED, victim) == set(others)
    assert views(net, victim, others) == Counter({Status.DEAD: len(others)})
    net.run_until(resume + 10.0, stop=lambda: all_see(net, victim, Status.ALIVE, others))
    assert all_see(net, victim, Status.ALIVE, others), views(net, victim, others)
    assert net.now - resume < 3.0
    inc = net.nodes[victim].swim.incarnation
    assert inc > 0
    assert {net.nodes[o].swim.member(victim).incarnation for o in others} == {inc}
    assert log.of(EventKind.REFUTE, victim)
    assert log.observers(EventKind.JOIN, victim) == set(others)  # back from the dead
    # The stalled node itself declared nobody dead: it read its backlog before its timers ran.
    assert not [e for e in log.events if e[1] == victim and e[2] == EventKind.FAILED]


@pytest.mark.parametrize("lifeguard", [True, False], ids=["lifeguard", "swim"])
def test_brief_stall_is_suspected_at_most_never_declared_dead(lifeguard: bool) -> None:
    cfg = LAN if lifeguard else LAN.without_lifeguard()
    log = Log()
    net = SimNetwork(cfg, seed=13, loss=0.01, on_event=log)
    names = net.add_cluster(30)
    net.run_until(2.0)
    stall = min_suspicion(cfg, 30) - 1.5  # well inside the suspicion timeout
    for i in range(3):
        net.stall("n8", stall)
        net.run_until(net.now + stall + 10.0)
        assert all_see(net, "n8", Status.ALIVE, names), i
    assert log.of(EventKind.SUSPECT, "n8")  # it was noticed...
    assert not log.of(EventKind.FAILED)  # ...and never declared dead
    assert net.nodes["n8"].swim.incarnation >= 1


def _deaths_of_a_node_stopped_in_bursts(seed: int) -> list[tuple[float, str]]:
    """``tests/test_integration.py``'s starved node on the simulator: 8 members, one stopped
    0.3 s of every 1 s for 20 s, then 1.5 s of every 2.5 s for 15 s."""
    log = Log()
    net = SimNetwork(LAN, seed=seed, on_event=log)
    net.add_cluster(8)
    net.run_until(5.0)
    net.run_until(net.stall_in_bursts("n4", STARVE_PHASES) + 10.0)
    return log.of(EventKind.FAILED)


def test_a_node_that_keeps_refuting_is_never_declared_dead() -> None:
    # Each long stop is suspected and refuted.  A member that misses one refutation keeps its
    # timer; with memberlist's 4 sends per broadcast at N=8 that happened in 4 of these 200
    # runs (seeds 44, 48, ...), always one member declaring the node dead.
    dead = {seed: d for seed in range(200) if (d := _deaths_of_a_node_stopped_in_bursts(seed))}
    assert dead == {}


# --- partitions --------------------------------------------------------------------------------

def test_partition_heals_through_push_pull() -> None:
    cfg = LAN.replace(push_pull_interval=5.0)
    log = Log()
    net = SimNetwork(cfg, seed=17, loss=0.01, on_event=log)
    names = net.add_cluster(20)
    left, right = names[:10], names[10:]
    net.run_until(2.0)
    net.partition(left, right)
    # Long enough for each side to declare the other dead and stop gossiping to it.
    net.run_until(net.now + 90.0)
    for a, b in ((left, right), (right, left)):
        for m in b:
            assert views(net, m, a) == Counter({Status.DEAD: len(a)})
        for m in a:
            assert all_see(net, m, Status.ALIVE, a)
    net.heal()
    healed_at = net.now
    net.run_until(healed_at + 60.0, stop=lambda: fully_converged(net, names))
    assert fully_converged(net, names)
    # "a few push-pull intervals" (the first push-pull after healing is up to one interval away).
    assert net.now - healed_at <= 4 * cfg.push_pull_interval, net.now - healed_at


# --- name conflicts ----------------------------------------------------------------------------

def test_name_conflict_is_reported_and_does_not_steal_the_address() -> None:
    log = Log()
    net = SimNetwork(LAN, seed=19, on_event=log)
    names = net.add_cluster(15)
    net.run_until(2.0)
    original = net.nodes["n3"].addr
    impostor = net.add_node("impostor", node_name="n3", addr=("10.9.9.9", 7946), join=["n0"])
    net.run_until(net.now + 20.0)
    conflicted = {o for t, o, k, m, _ in log.events if k == EventKind.CONFLICT and m == "n3"}
    assert "n0" in conflicted  # the seed saw the claim during the join
    assert "impostor" in conflicted  # and the impostor was told the name is taken
    # Its alive is gossiped a few times; every receiver reports the clash and drops the claim
    # (nobody re-broadcasts it, so it does not flood).
    assert len(conflicted) >= 4
    for name in names:
        m = net.nodes[name].swim.member("n3")
        assert m is not None and m.addr == original and m.status == Status.ALIVE
    assert impostor.swim.member("n3").addr == impostor.addr
    assert not log.of(EventKind.FAILED)


# --- node state --------------------------------------------------------------------------------

def test_small_node_state_spreads_by_broadcast() -> None:
    log = Log()
    net = SimNetwork(LAN, seed=23, loss=0.01, on_event=log)
    names = net.add_cluster(40)
    net.run_until(2.0)
    src = net.nodes["n5"]
    blob = b"gpu0:free=71GiB;" * 8
    assert len(blob) <= LAN.max_state_delta_bytes
    version = src.swim.publish_state(blob, net.now)
    net._after(src)
    published = net.now

    def everyone_has() -> bool:
        return all(net.nodes[n].swim.node_state("n5") == (version, blob) for n in names)

    net.run_until(published + 10.0, stop=everyone_has)
    assert everyone_has()
    assert net.now - published < 3.0  # gossip speed: push-pull is 30 s+ away
    assert log.observers(EventKind.STATE, "n5") == set(names) - {"n5"}


def test_large_node_state_spreads_by_push_pull_only() -> None:
    cfg = LAN.replace(push_pull_interval=2.0)
    log = Log()
    net = SimNetwork(cfg, seed=29, loss=0.01, on_event=log)
    names = net.add_cluster(20)
    net.run_until(1.0)
    src = net.nodes["n2"]
    blob = bytes(range(256)) * 12
    assert len(blob) > cfg.max_state_delta_bytes
    version = src.swim.publish_state(blob, net.now)
    net._after(src)
    assert not src.swim._broadcasts.contains("s:n2")
    published = net.now

    def everyone_has() -> bool:
        return all(net.nodes[n].swim.node_state("n2") == (version, blob) for n in names)

    net.run_until(published + 60.0, stop=everyone_has)
    assert everyone_has()
    assert not any(net.nodes[n].swim._broadcasts.contains("s:n2") for n in names)
    # Epidemic push-pull: a handful of intervals, not one per member.
    assert net.now - published < 10 * cfg.push_pull_interval
    assert sum(net.nodes[n].swim.stats.push_pull_completed for n in names) > 0


# --- determinism -------------------------------------------------------------------------------

def _eventful_run(seed: int) -> list[tuple[float, str, EventKind, str, int]]:
    log = Log()
    net = SimNetwork(LAN.replace(push_pull_interval=5.0), seed=seed, loss=0.02, on_event=log)
    names = net.add_cluster(25)
    net.at(1.0, lambda: net.kill("n3"))
    net.at(2.0, lambda: net.stall("n7", 4.0))
    net.at(3.0, lambda: net.add_node("late", join=["n0"]))
    net.at(4.0, lambda: net.leave("n11"))
    net.at(5.0, lambda: net.partition(names[:12], names[12:] + ["late"]))
    net.at(40.0, net.heal)
    net.run_until(80.0)
    return log.events


def test_same_seed_gives_identical_event_logs() -> None:
    a = _eventful_run(31)
    b = _eventful_run(31)
    assert len(a) > 100
    assert a == b
    kinds = Counter(k for _, _, k, _, _ in a)
    assert kinds[EventKind.FAILED] and kinds[EventKind.LEFT] and kinds[EventKind.JOIN]
    assert _eventful_run(32) != a


# --- scale -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_thousand_nodes_detect_a_failure_within_the_bound() -> None:
    log = Log()
    net = SimNetwork(LAN, seed=37, loss=0.01, on_event=log)
    names = net.add_cluster(1000)
    net.run_until(3.0)
    net.kill("n500")
    live = set(names) - {"n500"}
    net.run_until(60.0, stop=lambda: len(log.observers(EventKind.FAILED, "n500")) == len(live))
    assert log.observers(EventKind.FAILED, "n500") == live
    bound = min_suspicion(LAN, 1000) + 5 * LAN.probe_interval
    assert max(t for t, _ in log.of(EventKind.FAILED)) - 3.0 <= bound
    assert math.isclose(bound, 17.0)
    assert {m for _, _, k, m, _ in log.events if k == EventKind.FAILED} == {"n500"}


def _healthy_declared_dead(lifeguard: bool, seed: int = 3) -> int:
    """(observer, victim) pairs where a member that is not slow is declared dead, while 5 of
    100 members handle every packet 12 s late (past plain SWIM's 8 s timeout at N=100)."""
    cfg = LAN if lifeguard else LAN.without_lifeguard()
    pairs: set[tuple[str, str]] = set()
    net = SimNetwork(cfg, seed=seed, loss=0.01,
                     on_event=lambda o, ev: pairs.add((o, ev.member.name))
                     if ev.kind is EventKind.FAILED else None)
    names = net.add_cluster(100)
    slow = set(names[::20])
    for name in slow:
        net.slow(name, 12.0)
    net.run_until(90.0)
    return sum(1 for _, victim in pairs if victim not in slow)


def test_lifeguard_keeps_slow_members_from_killing_healthy_ones() -> None:
    # Lifeguard's point: a member that cannot hear in time (CPU-starved) accuses healthy peers
    # and cannot hear their refutations.  Plain SWIM's fixed timeout lets it declare them dead;
    # Lifeguard's health score and confirmation-driven timeout mostly do not.
    off = _healthy_declared_dead(lifeguard=False)
    on = _healthy_declared_dead(lifeguard=True)
    assert off >= 20
    assert on * 10 <= off
