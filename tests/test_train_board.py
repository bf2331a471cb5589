"""The placements group's state machine: jobs through their lease life cycle."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from meshd.train.board import MAX_ATTEMPTS, PlacementStore
from policy.store import PolicyStore


def job(jid: str = "j1", **extra: Any) -> dict[str, Any]:
    return {"id": jid, "model": "m", "command": ["python", "-c", "pass"], **extra}


def submit(s: PlacementStore, at: float = 1.0, **kw: Any) -> dict[str, Any]:
    return s.apply({"op": "submit", "job": job(**kw), "at": at, "author": "alice"})


def acquire(s: PlacementStore, at: float, node: str = "n1", gpus: list[str] | None = None,
            jid: str = "j1") -> dict[str, Any]:
    return s.apply({"op": "acquire", "job": jid, "holder": node, "node": node,
                    "gpus": gpus if gpus is not None else ["0"], "ttl": 5.0,
                    "start_timeout": 10.0, "at": at})


def state(s: PlacementStore, jid: str = "j1") -> dict[str, Any]:
    doc = s.get("TrainingJob", jid)
    assert doc is not None
    return doc.document.spec


def test_a_job_runs_through_its_life_cycle() -> None:
    s = PlacementStore(["TrainingJob", "TrainingPlacement"])
    r = submit(s)
    assert r["ok"] and r["created"] and state(s)["state"] == "queued"
    assert state(s)["submitted_at"] == state(s)["queued_at"] == 1.0
    a = acquire(s, 2.0)
    assert a["ok"] and a["token"] == 1
    st_ = state(s)
    assert (st_["state"], st_["node"], st_["gpus"], st_["attempt"]) == ("placed", "n1", ["0"], 1)
    placement = s.get("TrainingPlacement", "j1")
    assert placement is not None and placement.document.spec["lease"]["expires_unix"] == 12.0
    r = s.apply({"op": "renew", "job": "j1", "token": 1, "at": 3.0, "progress": 0.25,
                 "step": 10, "loss": 0.5, "checkpoint": "/ck/10"})
    assert r["ok"] and r["cancel"] is False and r["expires_at"] == 8.0
    st_ = state(s)
    assert (st_["state"], st_["step"], st_["loss"], st_["checkpoint"], st_["started_at"]) == \
        ("running", 10, 0.5, "/ck/10", 3.0)
    r = s.apply({"op": "release", "job": "j1", "token": 1, "at": 4.0, "outcome": "done"})
    assert r["ok"]
    st_ = state(s)
    assert (st_["state"], st_["progress"], st_["ended_at"]) == ("done", 1.0, 4.0)
    assert s.get("TrainingPlacement", "j1") is None
    assert acquire(s, 5.0)["error"] == "finished"


def test_submit_is_idempotent_and_a_different_spec_conflicts() -> None:
    s = PlacementStore(["TrainingJob", "TrainingPlacement"])
    first = submit(s)
    again = submit(s, at=9.0)
    assert again == {"ok": True, "version": first["version"], "created": False, "job": "j1"}
    other = submit(s, priority=9)
    assert other["error"] == "conflict" and other["field"] == "job.id"


def test_bad_specs_name_the_field() -> None:
    s = PlacementStore(["TrainingJob", "TrainingPlacement"])
    r = s.apply({"op": "submit", "job": {"id": "j", "model": "m", "command": ["x"],
                                         "gpus": {"count": -1}}, "at": 1.0})
    assert r["error"] == "invalid" and r["field"] == "job.gpus.count"
    r = s.apply({"op": "submit", "job": {"id": "j", "model": "m"}, "at": 1.0})
    assert r["error"] == "invalid" and r["field"] == "job.command"
    assert s.apply({"op": "renew", "job": "nope", "token": 1, "at": 1.0})["field"] == "job"


def test_policy_commands_cannot_write_job_documents() -> None:
    s = PlacementStore(["TrainingJob", "TrainingPlacement"])
    r = s.apply({"op": "put", "doc": {"kind": "TrainingJob", "name": "x", "spec": {"job": {}}}})
    assert r["error"] == "invalid" and "scheduler" in r["message"]
    submit(s)
    assert s.apply({"op": "delete", "kind": "TrainingJob", "name": "j1"})["error"] == "invalid"
    assert s.get("TrainingJob", "j1") is not None


def test_a_lapsed_lease_requeues_then_fails_after_max_attempts() -> None:
    s = PlacementStore(["TrainingJob", "TrainingPlacement"])
    submit(s)
    at = 1.0
    for attempt in range(1, MAX_ATTEMPTS + 1):
        a = acquire(s, at, node=f"n{attempt}")
        assert a["ok"], a
        live = s.apply({"op": "expire", "job": "j1", "token": a["token"], "at": at + 1})
        assert live["error"] == "live"
        at += 11.0  # past the start timeout: never renewed
        r = s.apply({"op": "expire", "job": "j1", "token": a["token"], "at": at})
        assert r["ok"], r
        assert s.get("TrainingPlacement", "j1") is None
        assert state(s)["queued_at"] == at or attempt == MAX_ATTEMPTS
    st_ = state(s)
    assert st_["state"] == "failed" and st_["tried"] == [f"n{i}" for i in
                                                         range(1, MAX_ATTEMPTS + 1)]


def test_an_expired_lease_fences_its_trainer() -> None:
    s = PlacementStore(["TrainingJob", "TrainingPlacement"])
    submit(s)
    a = acquire(s, 1.0, node="n1")
    s.apply({"op": "expire", "job": "j1", "token": a["token"], "at": 20.0})
    b = acquire(s, 20.0, node="n2")
    assert b["token"] > a["token"]
    late = s.apply({"op": "renew", "job": "j1", "token": a["token"], "at": 21.0})
    assert late["error"] == "fenced"
    assert state(s)["node"] == "n2"


def test_cancel_waits_for_the_holder_then_ends_the_job() -> None:
    s = PlacementStore(["TrainingJob", "TrainingPlacement"])
    submit(s, jid="q")
    assert s.apply({"op": "cancel", "job": "q", "at": 2.0, "author": "bob"})["ok"]
    assert state(s, "q")["state"] == "cancelled"
    submit(s)
    a = acquire(s, 2.0)
    assert s.apply({"op": "cancel", "job": "j1", "at": 3.0, "author": "bob"})["ok"]
    assert state(s)["state"] == "placed" and state(s)["cancel"] is True
    r = s.apply({"op": "renew", "job": "j1", "token": a["token"], "at": 4.0})
    assert r["ok"] and r["cancel"] is True
    s.apply({"op": "release", "job": "j1", "token": a["token"], "at": 5.0, "outcome": "failed"})
    assert state(s)["state"] == "cancelled"
    assert s.apply({"op": "cancel", "job": "j1", "at": 6.0})["error"] == "finished"


def test_a_job_handed_back_is_queued_again() -> None:
    s = PlacementStore(["TrainingJob", "TrainingPlacement"])
    submit(s)
    a = acquire(s, 1.0)
    s.apply({"op": "release", "job": "j1", "token": a["token"], "at": 2.0, "outcome": "moved",
             "message": "n1 is draining"})
    assert state(s)["state"] == "queued" and state(s)["message"] == "n1 is draining"
    assert state(s)["queued_at"] == 2.0
    assert acquire(s, 3.0, node="n2")["ok"]


def test_snapshots_carry_the_lease_table_and_read_copies_accept_them() -> None:
    s = PlacementStore(["TrainingJob", "TrainingPlacement"])
    submit(s)
    acquire(s, 1.0)
    snap = s.snapshot()
    back = PlacementStore.restore(snap)
    assert back.snapshot() == snap
    assert back.leases.holder_of("n1", "0", 2.0) is not None
    reader = PolicyStore.restore(snap)  # a node's read copy ignores the leases
    assert reader.get("TrainingJob", "j1") == s.get("TrainingJob", "j1")


_OPS = st.sampled_from(["submit", "cancel", "acquire", "renew", "release", "expire", "put",
                        "bogus"])
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 30), st.floats(allow_nan=True),
                    st.text(max_size=4), st.sampled_from(["j1", "j2", "n1", "0", "done"]))


@st.composite
def commands(draw: st.DrawFn) -> dict[str, Any]:
    op = draw(_OPS)
    cmd: dict[str, Any] = {"op": op, "at": draw(st.floats(0, 100))}
    if op == "submit":
        cmd["job"] = draw(st.one_of(st.builds(lambda j: job(j), st.sampled_from(["j1", "j2"])),
                                    st.dictionaries(st.text(max_size=3), _VALUES, max_size=3)))
    else:
        for key in ("job", "token", "holder", "node", "gpus", "ttl", "outcome", "progress",
                    "loss", "doc"):
            if draw(st.booleans()):
                cmd[key] = draw(st.one_of(_VALUES, st.lists(_VALUES, max_size=2)))
        if draw(st.booleans()):
            cmd["job"] = draw(st.sampled_from(["j1", "j2"]))
            cmd["token"] = draw(st.integers(1, 4))
    return cmd


@settings(max_examples=150, deadline=None)
@given(st.lists(commands(), max_size=40))
def test_any_command_sequence_never_raises_and_snapshots_round_trip(
        cmds: list[dict[str, Any]]) -> None:
    s = PlacementStore(["TrainingJob", "TrainingPlacement"])
    for cmd in cmds:
        r = s.apply(cmd)
        assert isinstance(r, dict) and "ok" in r, (cmd, r)
        assert r.get("error") != "internal", (cmd, r)
    snap = s.snapshot()
    assert PlacementStore.restore(snap).snapshot() == snap
    # The projection agrees with the table: a placement document per live lease record.
    assert {d.document.name for d in s.list("TrainingPlacement")} == set(s.leases.leases)
