"""SWIM + Lifeguard protocol rules, with 2-4 ``Swim`` cores wired by hand or fed crafted packets.

Time is always explicit: nothing here reads a clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from gossip import codec
from gossip.config import Config
from gossip.events import EventKind, MemberEvent
from gossip.keyring import Keyring
from gossip.protocol import StreamRequest, Swim
from gossip.state import Addr, NodeMeta, Status

CFG = Config.lan(push_pull_interval=0.0)
ADDR: dict[str, Addr] = {n: (f"10.0.0.{i}", 7946) for i, n in enumerate("abcdefgh", 1)}
META_GPU = NodeMeta.build(roles=["gpu"], zone="z1")
META_ROUTER = NodeMeta.build(roles=["router"], zone="z2", ports={"score": 7961})


def make(name: str, cfg: Config = CFG, now: float = 0.0, seed: int = 1, **kw: Any) -> Swim:
    return Swim(cfg, name, ADDR[name], now=now, rng=random.Random(seed), **kw)


def pkt(*msgs: bytes) -> bytes:
    return codec.seal(codec.compound(list(msgs)), None)


def alive(name: str, inc: int, meta: NodeMeta | None = None, addr: Addr | None = None) -> bytes:
    host, port = addr or ADDR[name]
    return codec.alive(inc, name, host, port, (meta or NodeMeta()).encode())


def feed(node: Swim, *msgs: bytes, now: float = 0.0, src: str = "h") -> list[MemberEvent]:
    node.receive(pkt(*msgs), ADDR[src], now)
    return node.events()


def kinds(events: list[MemberEvent], name: str | None = None) -> list[EventKind]:
    return [e.kind for e in events if name is None or e.member.name == name]


def learn(node: Swim, *names: str, inc: int = 0, now: float = 0.0) -> None:
    feed(node, *(alive(n, inc) for n in names), now=now)


def sent_messages(node: Swim) -> list[tuple[Addr, list[Any]]]:
    """Drain and decode what ``node`` wants to send."""
    out = []
    for data, addr in node.datagrams_to_send():
        for msg in codec.decode_packet(data, node.keyring):
            out.append((addr, msg))
    return out


def status(node: Swim, name: str) -> Status | None:
    m = node.member(name)
    return m.status if m else None


class Net:
    """Zero-latency wiring of a few cores, with a per-link drop rule and push-pull streams."""

    def __init__(self, *nodes: Swim) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.by_addr = {n.local.addr: n for n in nodes}
        self.drop: Callable[[str, str], bool] = lambda src, dst: False
        self.events: dict[str, list[MemberEvent]] = {n: [] for n in self.nodes}
        self.now = 0.0

    def flush(self) -> None:
        for _ in range(1000):
            busy = False
            for src in list(self.nodes.values()):
                for req in src.streams_to_open():
                    busy = True
                    dst = self.by_addr.get(req.addr)
                    if dst is None or self.drop(src.name, dst.name):
                        src.stream_failed(req, self.now)
                        continue
                    reply = dst.handle_stream(req.payload, src.local.addr, self.now)
                    if reply is None:
                        src.stream_failed(req, self.now)
                    else:
                        src.stream_reply(reply, req, self.now)
                for data, addr in src.datagrams_to_send():
                    busy = True
                    dst = self.by_addr.get(addr)
                    if dst is not None and not self.drop(src.name, dst.name):
                        dst.receive(data, src.local.addr, self.now)
            for name, node in self.nodes.items():
                self.events[name].extend(node.events())
            if not busy:
                return
        raise AssertionError("packet storm")

    def run_until(self, end: float, stop: Callable[[], bool] | None = None) -> None:
        """Tick every node at its timers until ``end``; ``stop`` is checked right after each
        round of ticks, before what they sent is delivered."""
        self.flush()
        while True:
            t = min(n.next_timer() for n in self.nodes.values())
            if t > end:
                self.now = end
                return
            self.now = max(self.now, t)
            for node in self.nodes.values():
                if node.next_timer() <= self.now:
                    node.tick(self.now)
            if stop is not None and stop():
                return
            self.flush()

    def join_all(self) -> None:
        first, *rest = self.nodes.values()
        for node in rest:
            node.join([first.local.addr])
        self.flush()
        self.run_until(self.now + 3.0)
        for node in self.nodes.values():
            assert node.num_live() == len(self.nodes), node.name


# --- alive and incarnations ----------------------------------------------------------------


def test_alive_introduces_member_with_join_event() -> None:
    b = make("b")
    ev = feed(b, alive("c", 5, META_GPU))
    assert kinds(ev) == [EventKind.JOIN]
    m = b.member("c")
    assert m is not None and m.status == Status.ALIVE and m.incarnation == 5
    assert m.addr == ADDR["c"] and m.meta == META_GPU
    assert b.num_live() == 2


def test_alive_lower_equal_higher_incarnation() -> None:
    b = make("b")
    feed(b, alive("c", 5, META_GPU), now=1.0)
    # Lower: ignored.
    assert feed(b, alive("c", 4, META_ROUTER), now=2.0) == []
    assert b.member("c").incarnation == 5 and b.member("c").meta == META_GPU
    # Equal with other metadata: ignored (metadata only changes with a new incarnation).
    assert feed(b, alive("c", 5, META_ROUTER), now=3.0) == []
    assert b.member("c").meta == META_GPU
    # Higher, same metadata: accepted silently.
    assert feed(b, alive("c", 6, META_GPU), now=4.0) == []
    m = b.member("c")
    assert m.incarnation == 6 and m.status == Status.ALIVE
    assert m.status_since == 1.0  # no status change


def test_meta_change_emits_update() -> None:
    b = make("b")
    feed(b, alive("c", 1, META_GPU))
    ev = feed(b, alive("c", 2, META_ROUTER), now=5.0)
    assert kinds(ev) == [EventKind.UPDATE]
    assert ev[0].member.meta == META_ROUTER and ev[0].at == 5.0
    assert b.member("c").meta.ports_dict == {"score": 7961}


def test_invalid_meta_is_counted_and_dropped() -> None:
    b = make("b")
    ev = feed(b, codec.alive(1, "c", *ADDR["c"], b"\xc1garbage"))
    assert ev == [] and b.member("c") is None
    assert b.stats.dropped["meta"] == 1


def test_alive_about_self_older_or_same_is_ignored_newer_is_refuted() -> None:
    a = make("a", incarnation=3)
    assert feed(a, alive("a", 2)) == [] and a.incarnation == 3
    assert feed(a, alive("a", 3)) == [] and a.incarnation == 3
    # Someone spreads a newer life of ours (e.g. before a restart): outbid it.
    ev = feed(a, alive("a", 9), now=1.0)
    assert kinds(ev) == [EventKind.REFUTE]
    assert a.incarnation == 10 and a.local.status == Status.ALIVE
    # Same incarnation but different metadata than ours is not ours either.
    ev = feed(a, alive("a", 10, META_GPU), now=2.0)
    assert kinds(ev) == [EventKind.REFUTE] and a.incarnation == 11
    assert a.local.meta == NodeMeta()


# --- suspicion and refutation of self ------------------------------------------------------


def test_suspect_of_self_is_refuted_with_incarnation_plus_one() -> None:
    a = make("a")
    learn(a, "b")
    assert a.awareness.score == 0
    ev = feed(a, codec.suspect(0, "a", "b"), now=1.0, src="b")
    assert kinds(ev) == [EventKind.REFUTE]
    assert a.incarnation == 1 and a.local.status == Status.ALIVE
    assert a.awareness.score == 1  # Lifeguard: being suspected is a sign we are slow
    assert a.stats.refutations == 1
    # The refutation is gossiped: the next gossip round carries alive(a, 1).
    a.tick(2.0)
    alives = [m for _, m in sent_messages(a) if m[0] == codec.ALIVE and m[2] == "a"]
    assert alives and all(m[1] == 1 for m in alives)


def test_suspect_of_self_at_higher_incarnation_outbids_it() -> None:
    a = make("a", incarnation=2)
    feed(a, codec.suspect(7, "a", "b"))
    assert a.incarnation == 8


def test_stale_suspect_of_self_is_ignored() -> None:
    a = make("a", incarnation=5)
    assert feed(a, codec.suspect(4, "a", "b")) == []
    assert a.incarnation == 5 and a.awareness.score == 0


def test_dead_of_self_is_refuted() -> None:
    a = make("a", incarnation=1)
    ev = feed(a, codec.dead(1, "a", "b"), now=1.0)
    assert kinds(ev) == [EventKind.REFUTE]
    assert a.incarnation == 2 and a.local.status == Status.ALIVE
    assert a.awareness.score == 1
    # Even a "left" in our own name (an old life's leave) is refuted while we are not leaving.
    ev = feed(a, codec.dead(2, "a", "a"), now=2.0)
    assert kinds(ev) == [EventKind.REFUTE] and a.incarnation == 3


# --- dead and left --------------------------------------------------------------------------


def test_dead_with_from_equal_name_is_left() -> None:
    b = make("b")
    learn(b, "c", "d", inc=2)
    assert b.num_live() == 3
    ev = feed(b, codec.dead(2, "c", "c"), now=3.0)
    assert kinds(ev) == [EventKind.LEFT]
    assert status(b, "c") == Status.LEFT and b.member("c").status_since == 3.0
    ev = feed(b, codec.dead(2, "d", "b"), now=3.0)
    assert kinds(ev) == [EventKind.FAILED] and "declared dead by b" in ev[0].detail
    assert status(b, "d") == Status.DEAD
    assert b.num_live() == 1


def test_dead_rules() -> None:
    b = make("b")
    learn(b, "c", inc=5)
    assert feed(b, codec.dead(4, "c", "d")) == []       # older incarnation
    assert feed(b, codec.dead(1, "zz", "d")) == []      # unknown member
    assert kinds(feed(b, codec.dead(5, "c", "d"))) == [EventKind.FAILED]
    assert feed(b, codec.dead(9, "c", "d")) == []       # already dead
    assert feed(b, codec.suspect(9, "c", "d")) == []    # dead is not suspected again
    # The member's own leave arriving late corrects "dead" to "left" (once).
    ev = feed(b, codec.dead(9, "c", "c"))
    assert kinds(ev) == [EventKind.LEFT] and status(b, "c") == Status.LEFT
    assert feed(b, codec.dead(9, "c", "c")) == []
    assert feed(b, codec.dead(10, "c", "d")) == []      # left does not become dead
    assert feed(b, alive("c", 9)) == []                 # stale alive
    ev = feed(b, alive("c", 10), now=7.0)               # a new incarnation: back
    assert kinds(ev) == [EventKind.JOIN]
    assert status(b, "c") == Status.ALIVE and b.num_live() == 2


def test_dead_member_may_return_at_a_new_address() -> None:
    b = make("b")
    learn(b, "c", inc=3)
    feed(b, codec.dead(3, "c", "b"), now=1.0)
    new_addr = ("10.9.9.9", 7000)
    # Any incarnation is accepted when the name is reclaimed at a new address (memberlist).
    ev = feed(b, alive("c", 0, addr=new_addr), now=2.0)
    assert kinds(ev) == [EventKind.JOIN]
    m = b.member("c")
    assert m.addr == new_addr and m.status == Status.ALIVE and m.incarnation == 0


def test_dead_member_reclaim_time_is_respected() -> None:
    b = make("b", cfg=CFG.replace(dead_node_reclaim_time=60.0))
    learn(b, "c")
    feed(b, codec.dead(0, "c", "b"), now=10.0)
    new_addr = ("10.9.9.9", 7000)
    assert kinds(feed(b, alive("c", 1, addr=new_addr), now=30.0)) == [EventKind.CONFLICT]
    assert b.member("c").addr == ADDR["c"]
    assert kinds(feed(b, alive("c", 1, addr=new_addr), now=70.0)) == [EventKind.JOIN]
    assert b.member("c").addr == new_addr


def test_conflicting_address_for_live_member_is_not_merged() -> None:
    b = make("b")
    learn(b, "c", inc=1)
    ev = feed(b, alive("c", 5, META_GPU, addr=("10.6.6.6", 7946)), now=2.0)
    assert kinds(ev) == [EventKind.CONFLICT]
    assert "10.6.6.6:7946" in ev[0].detail
    m = b.member("c")
    assert m.addr == ADDR["c"] and m.incarnation == 1 and m.meta == NodeMeta()
    assert b.stats.conflicts == 1
    # Also when it is suspect (still live).
    feed(b, codec.suspect(1, "c", "d"))
    assert kinds(feed(b, alive("c", 9, addr=("10.6.6.6", 7946)))) == [EventKind.CONFLICT]
    # And for our own name.
    assert kinds(feed(b, alive("b", 9, addr=("10.6.6.6", 7946)))) == [EventKind.CONFLICT]
    assert b.local.addr == ADDR["b"] and b.incarnation == 0


# --- suspicion of others --------------------------------------------------------------------


def _four() -> Swim:
    a = make("a")
    learn(a, "b", "c", "d")
    assert a.num_live() == 4  # k = suspicion_mult - 2 = 2 confirmations expected
    return a


def _failed_between(a: Swim, name: str, before: float, after: float) -> None:
    a.tick(before)
    assert EventKind.FAILED not in kinds(a.events(), name), f"failed before {before}"
    assert status(a, name) == Status.SUSPECT
    a.tick(after)
    ev = a.events()
    assert EventKind.FAILED in kinds(ev, name), f"not failed at {after}"
    assert status(a, name) == Status.DEAD


def test_suspect_starts_timer_at_max_without_confirmations() -> None:
    a = _four()
    ev = feed(a, codec.suspect(0, "d", "b"), now=10.0)
    assert kinds(ev) == [EventKind.SUSPECT] and "suspected by b" in ev[0].detail
    assert status(a, "d") == Status.SUSPECT and a.num_live() == 4
    # min = 4 * max(1, log10 4) * 1 s = 4 s; max = 6 * 4 = 24 s.
    _failed_between(a, "d", 33.99, 34.0)


def test_confirmations_from_distinct_members_shorten_the_timer() -> None:
    a = _four()
    feed(a, codec.suspect(0, "d", "b"), now=10.0)
    # The accuser and repeats are not confirmations.
    feed(a, codec.suspect(0, "d", "b"), now=10.5)
    feed(a, codec.suspect(0, "d", "c"), now=11.0)
    feed(a, codec.suspect(0, "d", "c"), now=11.5)
    # 1 of 2: 24 - log(2)/log(3) * 20 = 11.381 s after the start.
    _failed_between(a, "d", 21.38, 21.382)


def test_two_confirmations_bring_the_timer_to_min() -> None:
    a = _four()
    feed(a, codec.suspect(0, "d", "b"), now=10.0)
    feed(a, codec.suspect(0, "d", "c"), now=11.0)
    feed(a, codec.suspect(0, "d", "a"), now=12.0)
    _failed_between(a, "d", 13.99, 14.0)


def test_small_cluster_uses_min_timeout() -> None:
    a = make("a")
    learn(a, "b", "c")  # n - 2 < k: no confirmations expected, min = 4 s
    feed(a, codec.suspect(0, "c", "b"), now=10.0)
    _failed_between(a, "c", 13.99, 14.0)


def test_suspect_rules() -> None:
    a = _four()
    feed(a, alive("d", 3))
    assert feed(a, codec.suspect(2, "d", "b")) == []    # older incarnation
    assert feed(a, codec.suspect(0, "zz", "b")) == []   # unknown member
    ev = feed(a, codec.suspect(4, "d", "b"))            # newer incarnation: taken
    assert kinds(ev) == [EventKind.SUSPECT] and a.member("d").incarnation == 4


def test_alive_with_higher_incarnation_clears_suspicion() -> None:
    a = _four()
    feed(a, codec.suspect(0, "d", "b"), now=10.0)
    assert feed(a, alive("d", 0), now=11.0) == []  # same incarnation does not refute
    ev = feed(a, alive("d", 1), now=12.0)
    assert kinds(ev) == [EventKind.ALIVE]
    assert status(a, "d") == Status.ALIVE and a.member("d").status_since == 12.0
    assert a.stats.suspicions_refuted == 1
    # A fresh suspicion gets a fresh timer (the first one, due at 34 s, is gone: a tick at
    # 73.99 s does not fail d).
    feed(a, codec.suspect(1, "d", "c"), now=50.0)
    _failed_between(a, "d", 73.99, 74.0)


def test_suspicion_at_a_newer_incarnation_restarts_the_timer() -> None:
    # We suspect d at 0 and miss its refutation (alive 1); d is then suspected again at 1.
    # That is a new suspicion with its own timer, not a confirmation of ours: counted as one,
    # our old timer (4 s after two confirmations) would declare d dead while d keeps refuting.
    a = _four()
    feed(a, codec.suspect(0, "d", "b"), now=10.0)
    feed(a, codec.suspect(0, "d", "c"), now=10.5)
    ev = feed(a, codec.suspect(1, "d", "c"), now=12.0)
    assert kinds(ev) == [EventKind.SUSPECT] and a.member("d").incarnation == 1
    feed(a, codec.suspect(1, "d", "b"), now=12.5)
    # 12 s + (24 - log(2)/log(3) * 20) = 23.381 s, not 14 s (the old timer's minimum).
    _failed_between(a, "d", 23.38, 23.382)


# --- leave ----------------------------------------------------------------------------------


def test_leave_is_seen_as_left_by_others() -> None:
    a, b, c = make("a", seed=1), make("b", seed=2), make("c", seed=3)
    net = Net(a, b, c)
    net.join_all()
    t = net.now
    a.leave(t)
    assert a.leaving and a.local.status == Status.LEFT
    assert not a.left_done(t)
    net.run_until(t + CFG.leave_propagate_delay)
    assert a.left_done(net.now)
    for other in (b, c):
        assert status(other, "a") == Status.LEFT
        assert kinds(net.events[other.name], "a")[-1] == EventKind.LEFT
        assert EventKind.FAILED not in kinds(net.events[other.name], "a")
        assert other.num_live() == 2
    # A leaving node does not refute what it hears about itself.
    inc = a.incarnation
    feed(a, codec.dead(inc, "a", "b"), now=net.now)
    assert a.incarnation == inc and a.local.status == Status.LEFT
    a.leave(net.now)  # idempotent


def test_update_meta_after_leave_does_not_undo_the_leave() -> None:
    a, b, c = make("a", seed=1), make("b", seed=2), make("c", seed=3)
    net = Net(a, b, c)
    net.join_all()
    a.leave(net.now)
    try:
        a.update_meta(META_GPU, net.now)
    except ValueError:
        pass  # refusing is fine too
    net.run_until(net.now + CFG.leave_propagate_delay + 1.0)
    for other in (b, c):
        assert status(other, "a") == Status.LEFT
        assert kinds(net.events[other.name], "a")[-1] == EventKind.LEFT


def test_left_member_stays_left_against_stale_alive() -> None:
    b = make("b")
    learn(b, "c", inc=2)
    feed(b, codec.dead(2, "c", "c"))
    assert feed(b, alive("c", 2)) == []
    b.handle_stream(_stream("d", [_rec("c", 2, Status.ALIVE)]), ADDR["d"], 1.0)
    assert status(b, "c") == Status.LEFT
    assert kinds(b.events(), "c") == []
    # A restarted c refutes with a higher incarnation and is back.
    assert kinds(feed(b, alive("c", 3), now=2.0)) == [EventKind.JOIN]


def test_update_meta_spreads_as_update() -> None:
    a, b = make("a", seed=1), make("b", seed=2)
    net = Net(a, b)
    net.join_all()
    a.update_meta(META_ROUTER, net.now)
    assert a.incarnation == 1 and a.local.meta == META_ROUTER
    net.run_until(net.now + 1.0)
    assert b.member("a").meta == META_ROUTER and b.member("a").incarnation == 1
    assert kinds(net.events["b"], "a")[-1] == EventKind.UPDATE
    big = NodeMeta.build(tags={f"k{i}": "v" * 200 for i in range(10)})
    with pytest.raises(ValueError, match="limit 1024"):
        a.update_meta(big, net.now)
    assert a.incarnation == 1


def test_dead_members_are_reaped_after_reap_time() -> None:
    a = make("a", cfg=CFG.replace(reap_time=10.0))
    learn(a, "b", "c")
    feed(a, codec.state("b", 1, b"s"))
    feed(a, codec.dead(0, "b", "c"), now=1.0)
    a.tick(10.5)
    assert a.member("b") is not None
    a.events()
    a.tick(11.5)
    assert a.member("b") is None and a.node_state("b") is None
    assert kinds(a.events(), "b") == [EventKind.REAP]
    assert {m.name for m in a.members()} == {"a", "c"}
    assert a.num_live() == 2


def test_encrypted_mesh_and_plaintext_rejected() -> None:
    key = bytes(range(32))
    a, b = (make(n, seed=i, keyring=Keyring([key])) for i, n in enumerate("ab", 1))
    net = Net(a, b)
    net.join_all()
    net.run_until(net.now + 5.0)
    assert a.stats.probes_ok >= 3 and sum(a.stats.dropped.values()) == 0
    a.receive(pkt(codec.ping(1, "a", "x")), ADDR["h"], net.now)
    assert a.stats.dropped["unencrypted"] == 1 and a.datagrams_to_send() == []
    assert a.handle_stream(_stream("x", []), ADDR["h"], net.now) is None
    assert a.stats.dropped["stream_unencrypted"] == 1


def test_next_timer_is_finite_and_not_before_the_last_tick() -> None:
    a = make("a", cfg=Config.lan())
    learn(a, "b")
    now = 0.0
    for _ in range(50):
        now = max(now, a.next_timer())
        a.tick(now)
        a.datagrams_to_send()
        t = a.next_timer()
        assert now <= t < now + 60.0


def test_nothing_is_due_right_after_a_tick() -> None:
    a = make("a")
    learn(a, "b")
    a.tick(10.0)
    assert a.next_timer() > 10.0


# --- probes ---------------------------------------------------------------------------------


def test_ping_for_another_name_is_dropped_as_misdirected() -> None:
    a = make("a")
    a.receive(pkt(codec.ping(7, "someone-else", "b")), ADDR["b"], 1.0)
    assert a.datagrams_to_send() == []
    assert a.stats.dropped["misdirected"] == 1


def test_ping_is_acked_with_the_same_seq() -> None:
    a = make("a")
    a.receive(pkt(codec.ping(7, "a", "b")), ADDR["b"], 1.0)
    a.receive(pkt(codec.ping(8, "", "b")), ADDR["b"], 1.0)  # no target name: accepted
    acks = [(addr, m) for addr, m in sent_messages(a) if m[0] == codec.ACK]
    assert [(addr, m[1]) for addr, m in acks] == [(ADDR["b"], 7), (ADDR["b"], 8)]


def test_ping_from_a_member_we_hold_dead_tells_it_so_it_refutes() -> None:
    a, c = make("a"), make("c")
    learn(a, "c")
    learn(c, "a")
    feed(a, codec.dead(0, "c", "b"))
    # c (which does not know it was declared dead) pings a; a acks and tells it.
    a.receive(pkt(codec.ping(1, "a", "c")), ADDR["c"], 1.0)
    for data, addr in a.datagrams_to_send():
        assert addr == ADDR["c"]
        c.receive(data, ADDR["a"], 1.0)
    assert EventKind.REFUTE in kinds(c.events())
    assert c.incarnation == 1


def test_direct_probe_ack_records_rtt() -> None:
    a, b = make("a"), make("b")
    net = Net(a, b)
    net.join_all()
    assert a.stats.probes_sent >= 1 and a.stats.probes_ok == a.stats.probes_sent
    assert a.stats.probes_failed == 0 and len(a.stats.probe_rtts) >= 1


def test_indirect_probe_via_helper_when_direct_path_is_cut() -> None:
    # Four nodes, so that a's random pick of indirect helpers (3 * n draws, as memberlist's
    # kRandomNodes) practically never comes back empty.
    a, b, c, d = (make(n, seed=i) for i, n in enumerate("abcd", 1))
    net = Net(a, b, c, d)
    net.join_all()
    net.drop = lambda src, dst: {src, dst} == {"a", "c"}
    net.run_until(net.now + 10.0)
    # a probed c several times; each direct ping was lost and a helper relayed the ack.
    assert a.stats.indirect_probes_sent >= 2
    assert a.stats.probes_failed == 0
    assert a.stats.probes_ok >= a.stats.probes_sent - 1  # the last one may still be pending
    assert a.stats.nacks_received == 0
    for node in (a, b, c, d):
        assert EventKind.SUSPECT not in kinds(net.events[node.name])
        assert node.num_live() == 4


def _first_failed_probe_of_c(cfg: Config) -> tuple[Net, Swim]:
    """a, b, d up and c down; run until a's own probe of c has failed (before anything a
    sends in that tick is delivered, so a later successful probe cannot mask the score)."""
    a, b, c, d = (make(n, cfg, seed=i) for i, n in enumerate("abcd", 1))
    net = Net(a, b, c, d)
    net.join_all()
    net.drop = lambda src, dst: "c" in (src, dst)
    net.run_until(net.now + 20.0, stop=lambda: a.stats.probes_failed >= 1)
    assert a.stats.probes_failed == 1
    assert status(a, "c") == Status.SUSPECT
    return net, a


def test_nack_from_helper_is_counted_and_spares_our_health() -> None:
    net, a = _first_failed_probe_of_c(CFG)
    helpers = a.stats.indirect_probes_sent
    assert helpers in (1, 2)  # b and/or d (a random pick, as memberlist's kRandomNodes)
    nacks_sent = net.nodes["b"].stats.nacks_sent + net.nodes["d"].stats.nacks_sent
    assert nacks_sent >= helpers and a.stats.nacks_received == helpers
    # Every helper answered with a nack: the target is the problem, not us.
    assert a.awareness.score == 0


def test_without_nacks_a_failed_probe_costs_health() -> None:
    net, a = _first_failed_probe_of_c(CFG.replace(nacks=False))
    assert a.stats.indirect_probes_sent in (1, 2)
    assert net.nodes["b"].stats.nacks_sent == 0 and a.stats.nacks_received == 0
    assert a.awareness.score == 1


def test_missing_nacks_mean_we_are_the_problem() -> None:
    a, b, c = make("a", seed=1), make("b", seed=2), make("c", seed=3)
    net = Net(a, b, c)
    net.join_all()
    net.drop = lambda src, dst: dst == "a"  # a receives nothing
    net.run_until(net.now + 10.0, stop=lambda: a.stats.probes_failed >= 1)
    # One helper asked, no nack came back: +1 (and never below what a direct miss costs).
    assert a.awareness.score >= 1


def test_suspected_member_refutes_through_the_buddy_ping() -> None:
    a, b, c = make("a", seed=1), make("b", seed=2), make("c", seed=3)
    net = Net(a, b, c)
    net.join_all()
    feed(a, codec.suspect(c.incarnation, "c", "b"), now=net.now, src="b")
    net.run_until(net.now + 5.0, stop=lambda: status(a, "c") == Status.ALIVE)
    assert status(a, "c") == Status.ALIVE
    assert c.stats.refutations == 1 and c.incarnation == 1


def test_buddy_ping_puts_the_suspicion_first_so_the_ack_carries_the_refutation() -> None:
    a, c = make("a"), make("c")
    learn(a, "c")
    learn(c, "a")
    feed(a, codec.suspect(0, "c", "b"), now=1.0)
    sent_messages(a)
    now = a.next_timer()
    a.tick(now)
    probe = [data for data, addr in a.datagrams_to_send() if addr == ADDR["c"]]
    assert len(probe) == 1
    kinds_sent = [m[0] for m in codec.decode_packet(probe[0], None)]
    assert kinds_sent[:2] == [codec.SUSPECT, codec.PING], kinds_sent
    sent_messages(c)
    c.receive(probe[0], ADDR["a"], now)
    reply = [msg for addr, msg in sent_messages(c) if addr == ADDR["a"]]
    assert [m[0] for m in reply][:2] == [codec.ACK, codec.ALIVE], reply
    assert reply[1][1] == 1 and reply[1][2] == "c"  # c's refutation, incarnation 1


# --- push-pull ------------------------------------------------------------------------------


def _stream(source: str, nodes: list[list[Any]], states: list[list[Any]] | None = None,
            join: bool = False) -> bytes:
    return codec.encode_stream(source, join, nodes, states or [], None)


def _rec(name: str, inc: int, st: Status, meta: NodeMeta | None = None) -> list[Any]:
    host, port = ADDR[name]
    return [name, host, port, inc, int(st), (meta or NodeMeta()).encode()]


def test_push_pull_merge_rules() -> None:
    a = make("a")
    learn(a, "b", "c", "d", inc=1)
    payload = _stream("e", [
        _rec("b", 1, Status.DEAD),                   # remote dead: only suspect locally
        _rec("c", 1, Status.LEFT),                   # remote left: left
        _rec("d", 3, Status.ALIVE, META_GPU),        # newer alive: taken, with its meta
        _rec("e", 0, Status.ALIVE),                  # new member
        _rec("f", 4, Status.DEAD),                   # unknown and dead: ignored
        _rec("g", 4, Status.SUSPECT),                # unknown and suspect: ignored
    ])
    reply = a.handle_stream(payload, ADDR["e"], 5.0)
    assert reply is not None
    assert status(a, "b") == Status.SUSPECT
    assert status(a, "c") == Status.LEFT
    assert a.member("d").incarnation == 3 and a.member("d").meta == META_GPU
    assert status(a, "e") == Status.ALIVE
    assert a.member("f") is None and a.member("g") is None
    ev = a.events()
    assert kinds(ev, "b") == [EventKind.SUSPECT] and "suspected by e" in ev[0].detail
    assert kinds(ev, "c") == [EventKind.LEFT]
    assert kinds(ev, "d") == [EventKind.UPDATE]
    assert kinds(ev, "e") == [EventKind.JOIN]
    assert a.stats.push_pull_received == 1
    # The reply is our full table.
    source, join, nodes, _states = codec.decode_stream(reply, None, CFG.max_stream_bytes)
    assert source == "a" and join is False
    table = {r[0]: (r[3], Status(r[4])) for r in nodes}
    assert table == {"a": (0, Status.ALIVE), "b": (1, Status.SUSPECT), "c": (1, Status.LEFT),
                     "d": (3, Status.ALIVE), "e": (0, Status.ALIVE)}


def test_push_pull_records_about_self_are_refuted() -> None:
    a = make("a", incarnation=2)
    a.handle_stream(_stream("b", [_rec("a", 2, Status.DEAD), _rec("b", 0, Status.ALIVE)]),
                    ADDR["b"], 1.0)
    assert a.incarnation == 3 and a.local.status == Status.ALIVE
    a.handle_stream(_stream("b", [_rec("a", 5, Status.LEFT)]), ADDR["b"], 2.0)
    assert a.incarnation == 6 and a.local.status == Status.ALIVE


def test_invalid_stream_is_dropped_and_counted() -> None:
    a = make("a")
    assert a.handle_stream(b"\x01\x00garbage", ADDR["b"], 1.0) is None
    assert a.stats.dropped["stream_msgpack"] == 1
    req = StreamRequest(ADDR["b"], b"", False)
    assert a.stream_reply(b"\x07", req, 1.0) is False
    assert a.stats.dropped["stream_truncated"] == 1 and a.stats.push_pull_failed == 1
    assert a.members() == [a.local]


def test_join_emits_a_join_stream_request_and_completes() -> None:
    a, b = make("a"), make("b")
    feed(b, alive("c", 0, META_GPU))
    a.join([ADDR["b"]])
    reqs = a.streams_to_open()
    assert len(reqs) == 1
    req = reqs[0]
    assert req.join is True and req.addr == ADDR["b"]
    source, join, nodes, _ = codec.decode_stream(req.payload, None, CFG.max_stream_bytes)
    assert source == "a" and join is True and [r[0] for r in nodes] == ["a"]
    reply = b.handle_stream(req.payload, ADDR["a"], 1.0)
    assert kinds(b.events()) == [EventKind.JOIN]
    assert a.stream_reply(reply, req, 1.0) is True
    assert {m.name for m in a.members()} == {"a", "b", "c"}
    assert kinds(a.events()) == [EventKind.JOIN, EventKind.JOIN]
    assert a.member("c").meta == META_GPU
    assert a.stats.push_pull_completed == 1


def test_periodic_push_pull_between_two_nodes() -> None:
    cfg = Config.lan(push_pull_interval=30.0)
    a, b = make("a", cfg, seed=1), make("b", cfg, seed=2)
    net = Net(a, b)
    net.join_all()  # b joined through a: one push-pull (plus any periodic one that came due)
    assert b.stats.push_pull_completed >= 1 and a.stats.push_pull_received >= 1
    joined = b.stats.push_pull_completed - b.stats.push_pull_started
    assert joined == 1
    # The first periodic exchange is staggered within the first 30 s, then every 30 s:
    # over 125 s that is 4 or 5 exchanges per node.
    net.run_until(125.0)
    for node in (a, b):
        assert 4 <= node.stats.push_pull_started <= 5
        assert node.stats.push_pull_failed == 0
    assert a.stats.push_pull_completed == a.stats.push_pull_started
    assert b.stats.push_pull_completed == b.stats.push_pull_started + 1
    assert b.stats.push_pull_received == a.stats.push_pull_started
    assert a.stats.push_pull_received == b.stats.push_pull_started + 1


# --- node state ------------------------------------------------------------------------------


def test_node_state_newest_version_wins() -> None:
    a = make("a")
    learn(a, "b")
    ev = feed(a, codec.state("b", 3, b"v3"), now=1.0)
    assert kinds(ev) == [EventKind.STATE] and ev[0].detail == "version 3"
    assert a.node_state("b") == (3, b"v3")
    assert feed(a, codec.state("b", 2, b"v2")) == []
    assert feed(a, codec.state("b", 3, b"other")) == []
    assert a.node_state("b") == (3, b"v3")
    feed(a, codec.state("b", 10, b"v10"))
    assert a.node_state("b") == (10, b"v10")
    # State of an unknown member is ignored.
    assert feed(a, codec.state("zz", 1, b"x")) == [] and a.node_state("zz") is None


def test_node_state_spreads_through_push_pull() -> None:
    a, b = make("a"), make("b")
    assert a.publish_state(b"hello", 0.5) == 1
    assert a.publish_state(b"hello2", 0.6) == 2
    a.join([ADDR["b"]])
    req = a.streams_to_open()[0]
    b.handle_stream(req.payload, ADDR["a"], 1.0)
    assert b.node_state("a") == (2, b"hello2")


def test_publish_state_limit() -> None:
    a = make("a", cfg=CFG.replace(max_state_bytes=10))
    with pytest.raises(ValueError, match="limit 10"):
        a.publish_state(bytes(11), 0.0)


def test_own_older_life_state_is_superseded() -> None:
    a = make("a")
    learn(a, "b")
    assert a.publish_state(b"mine", 1.0) == 1
    # An older life of ours published up to version 7; peers hold it.
    feed(a, codec.state("a", 7, b"old life"), now=2.0, src="b")
    assert a.node_state("a") == (8, b"mine")
    assert feed(a, codec.state("a", 5, b"older"), now=3.0) == []
    assert a.node_state("a") == (8, b"mine")


def test_own_older_life_state_seen_before_first_publish() -> None:
    a = make("a")
    learn(a, "b")
    feed(a, codec.state("a", 7, b"old life"), now=1.0, src="b")
    assert a.publish_state(b"fresh", 2.0) > 7


def test_a_small_state_is_broadcast_whole_a_large_one_as_its_delta() -> None:
    a = make("a", cfg=CFG.replace(max_state_delta_bytes=64))
    learn(a, "b")
    a.publish_state(b"small", 0.0, b"ignored")
    a.tick(a.next_timer())
    sent = [m for _, m in sent_messages(a) if m[0] in (codec.STATE, codec.STATE_DELTA)]
    assert sent and sent[0] == [codec.STATE, "a", 1, b"small"]
    a.publish_state(bytes(100), 1.0, b"d2")
    a.tick(max(a.next_timer(), 1.0))
    sent = [m for _, m in sent_messages(a) if m[0] in (codec.STATE, codec.STATE_DELTA)]
    assert sent and sent[0] == [codec.STATE_DELTA, "a", 2, b"d2"]
    a.publish_state(bytes(101), 2.0, bytes(65))  # the delta does not fit either: push-pull only
    a.tick(max(a.next_timer(), 2.0))
    assert not [m for _, m in sent_messages(a) if m[0] in (codec.STATE, codec.STATE_DELTA)]


def test_delta_is_held_over_the_state_until_a_newer_state_arrives() -> None:
    a = make("a")
    learn(a, "b")
    feed(a, codec.state("b", 3, b"v3"))
    ev = feed(a, codec.state_delta("b", 5, b"d5"), now=1.0)
    assert kinds(ev) == [EventKind.DELTA]
    assert a.node_state("b") == (3, b"v3") and a.node_delta("b") == (5, b"d5")
    assert feed(a, codec.state_delta("b", 5, b"again")) == []  # duplicates and older ones
    assert feed(a, codec.state_delta("b", 4, b"d4")) == []
    assert feed(a, codec.state_delta("b", 2, b"d2")) == []
    assert a.node_delta("b") == (5, b"d5")
    feed(a, codec.state("b", 4, b"v4"))  # push-pull brings an older whole state: delta stays
    assert a.node_state("b") == (4, b"v4") and a.node_delta("b") == (5, b"d5")
    feed(a, codec.state("b", 5, b"v5"))  # ... and a whole one as new replaces it
    assert a.node_delta("b") is None
    assert feed(a, codec.state_delta("b", 5, b"d5")) == []
    assert feed(a, codec.state_delta("zz", 9, b"x")) == [] and a.node_delta("zz") is None


def test_a_newer_nodes_optional_messages_are_skipped_and_the_rest_applied() -> None:
    import msgpack

    a = make("a")
    newer_alive = msgpack.packb([codec.ALIVE, 0, "b", "127.0.0.2", 7946, NodeMeta().encode(),
                                 "a field added later"], use_bin_type=True)
    ev = feed(a, msgpack.packb([100, "a message type added later"]), newer_alive)
    assert kinds(ev) == [EventKind.JOIN] and a.member("b") is not None
    assert a.stats.skipped_messages == 1 and sum(a.stats.dropped.values()) == 0


def test_a_node_of_another_mesh_is_refused_once_reported_and_gets_nothing() -> None:
    ours = NodeMeta.build(tags={"mesh": "a" * 32})
    a = make("a", meta=ours)
    other = NodeMeta.build(tags={"mesh": "b" * 32})
    events = feed(a, alive("b", 0, other)) + feed(a, alive("b", 1, other))
    assert a.member("b") is None and a.stats.dropped["other_mesh"] == 2
    assert [e.kind for e in events] == [EventKind.OTHER_MESH]  # reported once
    assert "b" * 32 in events[0].detail and "a" * 32 in events[0].detail
    assert kinds(feed(a, alive("c", 0, NodeMeta())), "c") == [EventKind.JOIN]  # says none
    assert kinds(feed(a, alive("d", 0, ours)), "d") == [EventKind.JOIN]
    # a push-pull from a node of the other mesh is dropped whole: nothing merged, no reply
    b = make("b", meta=other)
    learn(b, "e")
    payload = b._encode_stream(True)
    assert a.handle_stream(payload, ADDR["b"], 1.0) is None
    assert a.member("e") is None and a.stats.dropped["stream_other_mesh"] == 1


def test_state_and_delta_events_carry_what_gossip_holds() -> None:
    """The owner reads node state from the events alone: a STATE brings its blob and any
    delta still past it; a DELTA brings itself and the blob it applies over."""
    a = make("a")
    learn(a, "b")
    (ev,) = feed(a, codec.state_delta("b", 5, b"d5"))
    assert ev.kind == EventKind.DELTA and (ev.state, ev.delta) == (None, b"d5")
    (ev,) = feed(a, codec.state("b", 3, b"v3"), now=1.0)
    assert ev.kind == EventKind.STATE and (ev.state, ev.delta) == (b"v3", b"d5")
    (ev,) = feed(a, codec.state_delta("b", 6, b"d6"), now=2.0)
    assert (ev.state, ev.delta) == (b"v3", b"d6")
    (ev,) = feed(a, codec.state("b", 6, b"v6"), now=3.0)
    assert (ev.state, ev.delta) == (b"v6", None)


def test_delta_is_relayed_and_forgotten_with_its_member() -> None:
    a = make("a", cfg=CFG.replace(reap_time=1.0))
    learn(a, "b", "c")
    feed(a, codec.state_delta("b", 2, b"d"))
    a.tick(a.next_timer())
    assert [codec.STATE_DELTA, "b", 2, b"d"] in [m for _, m in sent_messages(a)]
    feed(a, codec.dead(0, "b", "b"), now=1.0)
    a.tick(5.0)
    assert a.member("b") is None and a.node_delta("b") is None


def test_own_older_life_delta_is_superseded() -> None:
    a = make("a")
    learn(a, "b")
    assert a.publish_state(b"mine", 1.0) == 1
    feed(a, codec.state_delta("a", 7, b"old life"), now=2.0, src="b")
    assert a.node_state("a") == (8, b"mine") and a.node_delta("a") is None


def test_large_state_reaches_everyone_by_delta_then_push_pull() -> None:
    cfg = CFG.replace(max_state_delta_bytes=64, push_pull_interval=10.0)
    nodes = [make(n, cfg=cfg, seed=i) for i, n in enumerate("abcdef")]
    net = Net(*nodes)
    net.join_all()
    a = nodes[0]
    a.publish_state(bytes(500), net.now, b"delta")
    version = a.node_state("a")[0]
    net.run_until(net.now + 2.0)
    assert all(n.node_delta("a") == (version, b"delta")  # or a push-pull was quicker
               or n.node_state("a") == (version, bytes(500)) for n in nodes[1:])
    assert sum(n.node_delta("a") is not None for n in nodes[1:]) >= 3
    net.run_until(net.now + 60.0)  # anti-entropy brings the whole state; the delta is spent
    assert all(n.node_state("a") == (version, bytes(500)) and n.node_delta("a") is None
               for n in nodes[1:])


# --- u64 edges --------------------------------------------------------------------------------


def test_refute_at_max_incarnation_does_not_crash() -> None:
    a = make("a")
    feed(a, codec.suspect(codec.MAX_U64, "a", "b"))
    assert a.incarnation <= codec.MAX_U64


def test_own_state_at_max_version_does_not_crash() -> None:
    a = make("a")
    a.publish_state(b"x", 0.0)
    feed(a, codec.state("a", codec.MAX_U64, b"x"))
    assert a.node_state("a")[0] <= codec.MAX_U64


def test_leave_tells_every_member_directly_and_stops_probing() -> None:
    a = make("a")
    learn(a, "b", "c", "d")
    a.datagrams_to_send()
    a.leave(1.0)
    leaves = {addr for addr, msg in sent_messages(a) if msg == [codec.DEAD, 0, "a", "a"]}
    assert leaves == {a.member(n).addr for n in ("b", "c", "d")}  # type: ignore[union-attr]
    # While the leave propagates, no more probes go out.
    for t in (2.0, 3.0, 4.0):
        a.tick(t)
        assert not [m for _, m in sent_messages(a) if m[0] == codec.PING]


# --- mesh ids in every datagram ----------------------------------------------------------------

MESH_A, MESH_B = "a" * 32, "b" * 32
OURS = NodeMeta.build(tags={"mesh": MESH_A})
THEIRS = NodeMeta.build(tags={"mesh": MESH_B})


def mesh_msg(mesh: str) -> bytes:
    return codec.mesh(codec.mesh_digest(mesh))


def types_sent(node: Swim) -> list[tuple[Addr, list[int]]]:
    """Drain ``node``'s datagrams: each one's address and message types, in order."""
    return [(addr, [m[0] for m in codec.decode_packet(data, node.keyring)])
            for data, addr in node.datagrams_to_send()]


def old_build_reads(types: list[int]) -> bool:
    """Whether a build older than optional types reads a packet: it drops the whole packet
    when one message's type is unknown to it (all of ours below 64 are known to it)."""
    return all(t < codec.OPTIONAL_TYPES for t in types)


def test_a_ping_of_another_mesh_is_dropped_whole_counted_reported_once_and_not_acked() -> None:
    a = make("a", meta=OURS)
    learn(a, "c")
    a.datagrams_to_send()
    packet = pkt(mesh_msg(MESH_B), codec.ping(7, "a", "b"), codec.suspect(0, "c", "b"))
    a.receive(packet, ADDR["b"], 1.0)
    a.receive(packet, ADDR["b"], 2.0)
    assert a.datagrams_to_send() == []  # no ack
    assert a.stats.dropped["other_mesh"] == 2
    assert status(a, "c") == Status.ALIVE  # nothing in it was applied
    (ev,) = a.events()  # reported once, under the node its ping names
    assert ev.kind == EventKind.OTHER_MESH and ev.member.name == "b"
    assert ev.member.addr == ADDR["b"]
    assert f"from {ADDR['b'][0]}:7946" in ev.detail and MESH_A in ev.detail
    assert codec.mesh_digest(MESH_B).hex() in ev.detail  # its id is not known here


def test_a_datagram_of_a_mesh_refused_before_is_reported_with_that_mesh_id() -> None:
    a = make("a", meta=OURS)
    feed(a, alive("b", 0, THEIRS))
    assert kinds(a.events()) == []
    feed(a, alive("b", 1, THEIRS))  # b is reported once already
    a.receive(pkt(mesh_msg(MESH_B), codec.ack(3)), ADDR["c"], 1.0)  # names no sender
    (ev,) = a.events()
    assert ev.member.name == f"{ADDR['c'][0]}:7946" and f"of mesh {MESH_B}" in ev.detail
    assert a.stats.dropped["other_mesh"] == 3 and a.stats.acks_received == 0


def test_a_ping_of_our_mesh_is_acked_with_our_mesh_message_first() -> None:
    a = make("a", meta=OURS)
    a.datagrams_to_send()
    a.receive(pkt(mesh_msg(MESH_A), codec.ping(7, "a", "b")), ADDR["b"], 1.0)
    ((addr, msgs),) = [(addr, codec.decode_packet(d, None)) for d, addr in a.datagrams_to_send()]
    assert addr == ADDR["b"] and msgs[0] == [codec.MESH, codec.mesh_digest(MESH_A)]
    assert msgs[1][:2] == [codec.ACK, 7]
    assert sum(a.stats.dropped.values()) == 0 and a.stats.skipped_messages == 0


def test_a_datagram_without_the_mesh_message_is_accepted_and_answered_without_it() -> None:
    a = make("a", meta=OURS)
    a.datagrams_to_send()
    ev = feed(a, alive("b", 0, NodeMeta()), codec.ping(7, "a", "b"), src="b")
    assert kinds(ev) == [EventKind.JOIN]
    ((addr, types),) = types_sent(a)
    assert addr == ADDR["b"] and types[0] == codec.ACK and old_build_reads(types)
    assert sum(a.stats.dropped.values()) == 0
    # A tagged member's name, but from another address and without the message: not it.
    feed(a, alive("c", 0, OURS))
    a.datagrams_to_send()
    a.receive(pkt(codec.ping(8, "a", "c")), ADDR["h"], 1.0)
    ((addr, types),) = types_sent(a)
    assert addr == ADDR["h"] and types[0] == codec.ACK and old_build_reads(types)


def test_a_node_without_a_mesh_id_sends_none_and_accepts_any() -> None:
    a = make("a")
    learn(a, "b")
    feed(a, alive("b", 1, OURS))
    a.datagrams_to_send()
    a.receive(pkt(mesh_msg(MESH_B), codec.ping(7, "a", "b")), ADDR["b"], 1.0)
    ((_, types),) = types_sent(a)
    assert types[0] == codec.ACK and old_build_reads(types)
    assert sum(a.stats.dropped.values()) == 0
    a.tick(a.next_timer())
    assert all(old_build_reads(t) for _, t in types_sent(a))


def test_only_peers_with_the_mesh_tag_get_the_mesh_message() -> None:
    """A member whose metadata lacks the mesh tag may be a build older than optional types,
    which drops any packet holding one: it gets every datagram as before."""
    a = make("a", meta=OURS)
    feed(a, alive("b", 0, OURS), alive("c", 0, NodeMeta()), alive("d", 0, META_GPU))
    a.datagrams_to_send()
    by_addr: dict[Addr, list[list[int]]] = {}
    now = 0.0
    for _ in range(30):  # probes, gossip and the relays below reach every peer
        now = a.next_timer()
        a.tick(now)
        for addr, types in types_sent(a):
            by_addr.setdefault(addr, []).append(types)
    assert set(by_addr) == {ADDR["b"], ADDR["c"], ADDR["d"]}
    assert all(t[0] == codec.MESH and t.count(codec.MESH) == 1 for t in by_addr[ADDR["b"]])
    for peer in ("c", "d"):
        assert all(old_build_reads(t) for t in by_addr[ADDR[peer]]), by_addr[ADDR[peer]]


def test_relays_and_leaves_carry_the_mesh_message_only_to_those_who_read_it() -> None:
    a = make("a", meta=OURS)
    feed(a, alive("b", 0, OURS), alive("c", 0, NodeMeta()))
    a.datagrams_to_send()

    def sent() -> dict[Addr, list[list[int]]]:
        out: dict[Addr, list[list[int]]] = {}
        for addr, types in types_sent(a):
            out.setdefault(addr, []).append(types)
        assert all(old_build_reads(t) for t in out.get(ADDR["c"], [])), out
        assert all(t[0] == codec.MESH for t in out.get(ADDR["b"], [])), out
        return out

    # b (ours, tagged) asks a to probe c (untagged); then c asks a to probe b.
    a.receive(pkt(mesh_msg(MESH_A), codec.indirect_ping(5, "c", *ADDR["c"], True, "b")),
              ADDR["b"], 0.1)
    a.receive(pkt(codec.indirect_ping(6, "b", *ADDR["b"], True, "c")), ADDR["c"], 0.1)
    out = sent()
    assert [codec.MESH, codec.PING] in [t[:2] for t in out[ADDR["b"]]]
    assert codec.PING in [t[0] for t in out[ADDR["c"]]]
    # A node not known yet (e) whose request names our mesh reads the message.
    a.receive(pkt(mesh_msg(MESH_A), codec.indirect_ping(7, "c", *ADDR["c"], True, "e")),
              ADDR["e"], 0.1)
    a.datagrams_to_send()
    a.tick(0.1 + CFG.probe_timeout * 0.8)  # nobody answered: nacks to the requesters
    out = sent()
    assert [codec.MESH, codec.NACK] in [t[:2] for t in out[ADDR["b"]]]
    assert [codec.MESH, codec.NACK] in [t[:2] for t in out[ADDR["e"]]]
    assert codec.NACK in [t[0] for t in out[ADDR["c"]]]
    a.leave(1.0)
    out = sent()
    assert [codec.MESH, codec.DEAD] in [t[:2] for t in out[ADDR["b"]]]
    assert codec.DEAD in [t[0] for t in out[ADDR["c"]]]


def test_the_mesh_message_is_charged_to_the_packet_budget() -> None:
    """Broadcasts of about 10 bytes fill a packet to within 10 bytes of its limit (encrypted:
    the budget reserves room for the nonce and tag), so a 12-byte mesh message left out of the
    budget would overflow it."""
    ring = Keyring([bytes(range(32))])
    a = make("a", meta=OURS, keyring=ring)

    def feed(node: Swim, *msgs: bytes) -> None:
        node.receive(codec.seal(codec.compound(list(msgs)), ring), ADDR["h"], 0.0)

    feed(a, alive("b", 0, OURS))
    names = [f"n{i}" for i in range(300)]
    feed(a, *(alive(n, 0, OURS, (f"10.1.0.{i}", 7946)) for i, n in enumerate(names[:200])))
    feed(a, *(alive(n, 0, OURS, (f"10.1.1.{i}", 7946)) for i, n in enumerate(names[200:])))
    for i in range(0, 300, 100):
        feed(a, *(codec.state(n, 1, b"") for n in names[i:i + 100]))
    a.datagrams_to_send()
    feed(a, mesh_msg(MESH_A), codec.ping(7, "a", "b"))  # acked
    ((data, _),) = a.datagrams_to_send()
    assert CFG.packet_size - 12 < len(data) <= CFG.packet_size, len(data)
    assert codec.decode_packet(data, ring)[0][0] == codec.MESH


def test_mixed_builds_converge_and_old_builds_never_get_the_mesh_message() -> None:
    """Two nodes of this build beside two that predate optional types (no mesh tag), joined
    by push-pull: every datagram to an old one is one it can read, the new ones tag theirs."""
    nodes = [make("a", seed=1, meta=OURS), make("b", seed=2, meta=OURS),
             make("c", seed=3), make("d", seed=4)]
    net = Net(*nodes)
    seen: list[tuple[str, str, list[int]]] = []
    for node in nodes:
        def capture(node: Swim = node, take: Any = node.datagrams_to_send) -> list[Any]:
            out = take()
            for data, addr in out:
                to = next(n.name for n in nodes if n.local.addr == addr)
                seen.append((node.name, to, [m[0] for m in codec.decode_packet(data, None)]))
            return out
        node.datagrams_to_send = capture  # type: ignore[method-assign]
    net.join_all()
    net.run_until(net.now + 10.0)
    assert all(n.num_live() == 4 for n in nodes)
    assert all(old_build_reads(t) for _, to, t in seen if to in "cd")
    new_to_new = [t for src, to, t in seen if src in "ab" and to in "ab"]
    assert new_to_new and all(t[0] == codec.MESH for t in new_to_new)
    assert sum(n.stats.dropped["other_mesh"] for n in nodes) == 0


def test_encrypted_datagrams_carry_the_mesh_message_inside() -> None:
    key = bytes(range(32))
    a, b = (make(n, seed=i, keyring=Keyring([key]), meta=OURS) for i, n in enumerate("ab", 1))
    feed_b = codec.seal(codec.compound([alive("b", 0, OURS)]), Keyring([key]))
    a.receive(feed_b, ADDR["b"], 0.0)
    a.datagrams_to_send()
    a.tick(a.next_timer())
    (data,) = [d for d, addr in a.datagrams_to_send() if addr == ADDR["b"]]
    assert codec.mesh_digest(MESH_A) not in data  # sealed with the rest
    assert codec.decode_packet(data, b.keyring)[0] == [codec.MESH, codec.mesh_digest(MESH_A)]
    other = codec.seal(codec.compound([mesh_msg(MESH_B), codec.ping(1, "a", "b")]),
                       Keyring([key]))
    a.receive(other, ADDR["b"], 1.0)
    assert a.stats.dropped["other_mesh"] == 1 and a.datagrams_to_send() == []
