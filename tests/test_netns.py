"""Real packet loss: 8 meshd processes in a network namespace whose loopback drops 10% of UDP.

Needs Linux, root, ``ip`` and ``iptables`` (``.ci/run`` installs iptables when it runs as root);
skips with the reason otherwise.  The namespace is created fresh and always deleted.  Admin
queries run inside the namespace through the cluster helper's query process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.cluster import Cluster, netns_create, netns_delete, netns_exec, netns_unavailable

pytestmark = [pytest.mark.netns, pytest.mark.slow]

LOSS = 0.1
CONVERGE = 75.0  # a join rumour lost to 10% loss is repaired by push-pull (30-60 s)


@pytest.fixture
def lossy_netns() -> Iterator[str]:
    """A fresh namespace dropping ``LOSS`` of incoming UDP; always deleted afterwards."""
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    try:
        name = netns_create()
    except (RuntimeError, OSError) as exc:  # e.g. a container without CAP_SYS_ADMIN
        pytest.skip(f"cannot create a network namespace: {exc}")
    try:
        rule = ["INPUT", "-p", "udp", "-m", "statistic", "--mode", "random",
                "--probability", str(LOSS), "-j", "DROP"]
        r = netns_exec(name, "iptables", "-A", *rule, check=False)
        if r.returncode != 0:
            pytest.skip(f"iptables cannot add a statistic DROP rule here: {r.stderr.strip()}")
        yield name
    finally:
        netns_delete(name)


def _dropped_packets(ns: str) -> int:
    out = netns_exec(ns, "iptables", "-L", "INPUT", "-v", "-n", "-x").stdout
    for line in out.splitlines():
        if "statistic" in line and "DROP" in line:
            return int(line.split()[0])
    return 0


def _timeline(c: Cluster, failed: list[tuple[str, str]]) -> str:
    """Every membership event about a wrongly failed member, in time order, so a failure in
    CI says who suspected whom, whether the refutation went out, and who never heard it."""
    wrong = {m for _, m in failed if m != "n8"}
    kinds = ("member_suspect", "member_alive", "member_refute", "member_failed")
    rows = sorted((e["ts"], e["node"], e["event"], e.get("incarnation"), e.get("detail", ""))
                  for kind in kinds for e in c.events(kind) if e.get("member") in wrong)
    lines = [f"wrongly failed: {sorted(wrong)}; declared by {failed}"]
    lines += [f"  {ts} {node:>3} {event:<14} inc={inc} {detail}"
              for ts, node, event, inc, detail in rows]
    return "\n".join(lines)


def test_membership_under_10_percent_udp_loss(lossy_netns: str, tmp_path: Path) -> None:
    c = Cluster(8, tmp_path, netns=lossy_netns)
    try:
        c.start()
        c.wait_converged(CONVERGE)

        c.node("n8").kill()
        t = time.monotonic()
        c.wait_for(lambda: c.all_see("n8", "dead"), 30, "n8 dead everywhere")
        detect = time.monotonic() - t

        assert c.node("n7").terminate() == 0
        c.wait_for(lambda: c.all_see("n7", "left"), 10, "n7 left everywhere (a member that "
                   "missed the leave broadcast suspects the leaver, declares it dead, and "
                   "push-pull never turns dead into left)")

        time.sleep(10)  # run on under loss: nobody else may be declared dead
        failed = [(e["node"], e["member"]) for e in c.events("member_failed")]
        assert all(member == "n8" for _, member in failed), _timeline(c, failed)
        # Every survivor still holds every survivor live (a suspicion may be in flight).
        survivors = [f"n{i}" for i in range(1, 7)]
        views = c.views()
        assert sorted(views) == survivors
        suspects = []
        for node, view in views.items():
            for name in survivors:
                assert view[name].status in ("alive", "suspect"), (node, view[name])
                if view[name].status == "suspect":
                    suspects.append(f"{node}->{name}")
        dropped = _dropped_packets(lossy_netns)
        assert dropped > 0, "the iptables rule dropped nothing: the test exercised no loss"
        suspicions = len(c.events("member_suspect"))
        print(f"\n10% UDP loss: kill -9 detected everywhere in {detect:.1f}s; "
              f"{dropped} datagrams dropped, {suspicions} suspicions, "
              f"deaths: {sorted({m for _, m in failed})}, suspect at the end: {suspects}")
    finally:
        c.close()
