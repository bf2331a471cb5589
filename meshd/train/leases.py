"""Soft leases on GPUs: the replicated state machine that keeps two trainers off one GPU.

The placements Raft group applies these commands on every coordinator, so :meth:`LeaseTable.
apply` is a function of (state, command) alone - no clock, no randomness, and no exception: a
bad command is an error *result*, the same everywhere.  Time is the ``at`` the leader stamped
on the command; the table never lets it go back (a new leader's clock may be behind the old
one's), so a lease that has expired stays expired.

``{"op": "acquire", "job", "holder", "parts": [{"node", "gpus"}, ...], "ttl",
"start_timeout", "at"}``
    grants the job a lease on each part's ``gpus`` (``[]``: a CPU slot) unless the job already
    holds one (``held``) or a live lease of another job covers one of them (``busy``, naming
    it).  One part is a job on one node; several are a **gang** over several nodes, in rank
    order.  ``"node", "gpus"`` in place of ``parts`` is the one-part form.  Each part runs
    ``start_timeout`` seconds until its first renewal, ``ttl`` after each.
``{"op": "renew", "job", "token", "node", "at", "progress", "step"}``
    extends the part on ``node`` (needed for gangs only) of the lease ``token`` names;
    ``fenced`` if the job's lease is not that one any more or the part was released,
    ``expired`` if the part lapsed (its trainer must have stopped: see :class:`LeaseKeeper`).
    For a gang that is ending - a part lapsed, or was released other than ``done`` - the
    grant carries ``stop``: why the other parts' trainers must stop their ranks too.
``{"op": "release", "job", "token", "node", "at", "outcome"}`` ends the part (``done``,
    ``failed``, ...) and frees its GPUs; the lease ends with its last part (``final``), with
    the gravest outcome any part gave (:data:`OUTCOMES` order: a crashed rank fails the job
    whatever its neighbours then said; a rank its trainer handed back moves it).
``{"op": "expire", "job", "token", "at"}`` reaps a lease whose every part has lapsed or was
    released (``live`` if not), so the scheduler can move its job; its trainers stopped on
    their own by then.

**Gangs** keep every part's own expiry: a part's GPUs stay leased until that part's trainer
has stopped (released, or lapsed by its keeper's rule), never because another part ended.
So the fencing argument below holds per part, and a gang is as safe as a single lease.

**Fencing tokens** are one counter over the whole table, so a token names exactly one grant
ever made: a trainer whose lease was taken over holds a smaller token than the new holder's,
and every write it makes with it (renewals, checkpoints stamped with it) is refused.

**Why this is safe across a partition.**  A grant's expiry is ``at + ttl`` by the leader's
clock, and ``at`` is stamped after the trainer sent its renewal.  The trainer's
:class:`LeaseKeeper` stops the job ``ttl - margin`` after it *sent* that renewal, by its own
monotonic clock.  So the trainer has stopped before the table can hand its GPUs to anyone,
as long as any two coordinators' clocks disagree by less than ``margin`` (the default 1 s;
NTP keeps them within milliseconds: the leader that stamped a renewal and the one that stamps
a later grant may differ) and no clock runs more than ``margin / ttl`` fast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from policy.errors import PolicyError
from policy.fields import Choice, Field, Integer, ListOf, Number, Object, Text, required

OUTCOMES = ("failed", "cancelled", "moved", "preempted", "retry", "done")
"""What a released part ended with, gravest first: ``failed`` (the job's code failed),
``cancelled``, ``moved`` (its trainer handed it back: drain), ``preempted``, ``retry`` (it
asked to run again elsewhere, e.g. a rank whose peer vanished: counts as a lost attempt),
``done``.  A gang's outcome is the gravest of its parts'."""

SNAPSHOT_FORMAT = 2
MAX_TTL = 86400.0
"""Longest ``ttl`` or ``start_timeout`` accepted, in seconds."""


@dataclass(frozen=True, slots=True)
class Part:
    """One node's share of a lease: its GPUs, renewed by that node's trainer."""

    node: str
    gpus: tuple[str, ...]
    expires_at: float
    renewals: int = 0
    outcome: str = ""
    """Set when the part's trainer released it (its rank has exited)."""

    @property
    def resources(self) -> tuple[str, ...]:
        return tuple(f"{self.node}/{g}" for g in self.gpus)

    def live(self, at: float) -> bool:
        return not self.outcome and at < self.expires_at

    def lapsed(self, at: float) -> bool:
        """Expired without a release: its trainer was cut off, frozen or died."""
        return not self.outcome and at >= self.expires_at


@dataclass(frozen=True, slots=True)
class Lease:
    """One job's hold on GPUs: one part per node, in rank order (one part unless a gang)."""

    job: str
    holder: str
    parts: tuple[Part, ...]
    token: int
    granted_at: float
    ttl: float
    """Seconds each renewal extends a part by."""
    progress: float = 0.0
    step: int = 0
    outcome: str = ""
    """The gravest outcome other than ``done`` a part was released with."""

    @property
    def node(self) -> str:
        """Rank 0's node."""
        return self.parts[0].node

    @property
    def gpus(self) -> tuple[str, ...]:
        """Rank 0's GPUs."""
        return self.parts[0].gpus

    @property
    def expires_at(self) -> float:
        """When the last unreleased part lapses (the lease may be reaped after)."""
        return max((p.expires_at for p in self.parts if not p.outcome), default=self.granted_at)

    @property
    def renewals(self) -> int:
        return sum(p.renewals for p in self.parts)

    @property
    def resources(self) -> tuple[str, ...]:
        """``node/gpu`` for each GPU of an unreleased part: what no other live lease may
        cover."""
        return tuple(r for p in self.parts if not p.outcome for r in p.resources)

    def live(self, at: float) -> bool:
        """Some part's trainer may still be running its rank."""
        return any(p.live(at) for p in self.parts)

    def part(self, node: str | None) -> int:
        """Index of the part on ``node`` (``None``: the only part)."""
        if node is None:
            if len(self.parts) > 1:
                raise PolicyError("node", f"job {self.job!r} runs on "
                                          f"{len(self.parts)} nodes; name the part's node")
            return 0
        for i, p in enumerate(self.parts):
            if p.node == node:
                return i
        raise _Refused("fenced", "node", f"no part of job {self.job!r} (token {self.token}) "
                                         f"is on {node!r}")

    def stopping(self, at: float) -> str:
        """Why a gang's running parts must stop (a part lapsed, or ended other than done);
        empty when none must."""
        for p in self.parts:
            if p.lapsed(at):
                return f"the rank on {p.node} lost its lease"
            if p.outcome and p.outcome != "done":
                return f"the rank on {p.node} ended: {p.outcome}"
        return ""


class LeaseTable:
    """Every job's current lease, the resources they cover, and the fencing counter."""

    def __init__(self) -> None:
        self.leases: dict[str, Lease] = {}
        self.owner: dict[str, str] = {}
        """``node/gpu`` -> the job whose lease covers it (live or not yet reaped)."""
        self.token = 0
        """The last fencing token handed out."""
        self.now = 0.0
        """The latest ``at`` applied: the table's clock, which never goes back."""

    # --- commands ---------------------------------------------------------------------------

    def apply(self, command: object) -> dict[str, Any]:
        """Apply one committed command; always returns a result dict, never raises."""
        try:
            if not isinstance(command, dict):
                raise PolicyError("command", "must be an object")
            handler = _OPS.get(str(command.get("op")))
            if handler is None:
                raise PolicyError("op", f"unknown op (one of {', '.join(_OPS)})")
            self.now = max(self.now, _AT(command.get("at"), "at"))
            return handler(self, command)
        except PolicyError as exc:
            return _error("invalid", exc.field, exc.message)
        except _Refused as exc:
            return _error(exc.code, exc.field, exc.message)
        except Exception as exc:  # noqa: BLE001 - a bug must not split the replicas
            return _error("internal", "", f"{type(exc).__name__}: {exc}")

    def _acquire(self, cmd: dict[str, Any]) -> dict[str, Any]:
        job, holder = _NAME(cmd.get("job"), "job"), _NAME(cmd.get("holder"), "holder")
        if "parts" in cmd:
            parts = [(p["node"], p["gpus"]) for p in _PARTS(cmd["parts"], "parts")]
        else:
            parts = [(_NAME(cmd.get("node"), "node"), _GPUS(cmd.get("gpus", []), "gpus"))]
        if not parts:
            raise PolicyError("parts", "must name at least one node")
        if len({n for n, _ in parts}) != len(parts):
            raise PolicyError("parts", "must be on distinct nodes")
        for i, (_, gpus) in enumerate(parts):
            if len(set(gpus)) != len(gpus):
                raise PolicyError("gpus" if "parts" not in cmd else f"parts[{i}].gpus",
                                  "must be distinct GPU ids")
        ttl = _TTL(cmd.get("ttl"), "ttl")
        start = _TTL(cmd["start_timeout"], "start_timeout") if "start_timeout" in cmd else ttl
        now = self.now
        current = self.leases.get(job)
        if current is not None and current.live(now):
            raise _Refused("held", "job", f"job {job!r} is held by {current.holder!r} "
                           f"(token {current.token}) until {current.expires_at:.3f}")
        resources = [f"{node}/{g}" for node, gpus in parts for g in gpus]
        for r in resources:
            other = self.owner.get(r)
            if other is not None and other != job and self.leases[other].live(now):
                raise _Refused("busy", "gpus", f"{r} is leased to job {other!r}")
        self._drop(job)
        for r in resources:
            other = self.owner.get(r)
            if other is not None:
                self._drop(other)  # expired: reaped now
        self.token += 1
        lease = Lease(job, holder, tuple(Part(n, tuple(g), now + start) for n, g in parts),
                      self.token, now, ttl)
        self.leases[job] = lease
        for r in resources:
            self.owner[r] = job
        return {"ok": True, "token": lease.token, "expires_at": lease.expires_at}

    def _renew(self, cmd: dict[str, Any]) -> dict[str, Any]:
        lease, i = self._part(cmd)
        part = lease.parts[i]
        if not part.live(self.now):
            raise _Refused("expired", "token", f"the lease of job {lease.job!r} on "
                           f"{part.node!r} lapsed at {part.expires_at:.3f}")
        progress, step = lease.progress, lease.step
        if i == 0:  # rank 0 speaks for the job's progress
            progress = _PROGRESS(cmd["progress"], "progress") if "progress" in cmd \
                else progress
            step = _STEP(cmd["step"], "step") if "step" in cmd else step
        parts = list(lease.parts)
        parts[i] = replace(part, expires_at=self.now + lease.ttl, renewals=part.renewals + 1)
        renewed = replace(lease, parts=tuple(parts), progress=progress, step=step)
        self.leases[lease.job] = renewed
        out = {"ok": True, "token": renewed.token, "expires_at": parts[i].expires_at,
               "ttl": renewed.ttl}
        stop = renewed.stopping(self.now)
        return {**out, "stop": stop} if stop else out

    def _release(self, cmd: dict[str, Any]) -> dict[str, Any]:
        outcome = _OUTCOME(cmd.get("outcome"), "outcome")
        lease, i = self._part(cmd)
        parts = list(lease.parts)
        parts[i] = replace(parts[i], outcome=outcome)
        for r in parts[i].resources:
            if self.owner.get(r) == lease.job:
                del self.owner[r]
        ended = replace(lease, parts=tuple(parts), outcome=min(
            (o for o in (lease.outcome, outcome) if o and o != "done"),
            key=OUTCOMES.index, default=""))
        if all(p.outcome for p in parts):
            self._drop(lease.job)
            return {"ok": True, "token": lease.token, "outcome": ended.outcome or "done",
                    "final": True}
        self.leases[lease.job] = ended
        return {"ok": True, "token": lease.token, "outcome": outcome, "final": False}

    def _expire(self, cmd: dict[str, Any]) -> dict[str, Any]:
        lease = self._held(cmd)
        if lease.live(self.now):
            raise _Refused("live", "token", f"the lease of job {lease.job!r} runs until "
                           f"{lease.expires_at:.3f}")
        self._drop(lease.job)
        return {"ok": True, "token": lease.token, "node": lease.node, "outcome": lease.outcome,
                "lapsed": [p.node for p in lease.parts if not p.outcome]}

    def _held(self, cmd: dict[str, Any]) -> Lease:
        """The job's lease, if ``cmd['token']`` still names it; else refused (``fenced``)."""
        job, token = _NAME(cmd.get("job"), "job"), _TOKEN(cmd.get("token"), "token")
        lease = self.leases.get(job)
        if lease is None or lease.token != token:
            held = f"token {lease.token}" if lease is not None else "no lease"
            raise _Refused("fenced", "token", f"token {token} no longer holds job {job!r} "
                           f"({held})")
        return lease

    def _part(self, cmd: dict[str, Any]) -> tuple[Lease, int]:
        """The lease ``cmd`` names and the index of its part on ``cmd['node']``, which must
        not have been released (``fenced``)."""
        lease = self._held(cmd)
        node = _NAME(cmd["node"], "node") if cmd.get("node") is not None else None
        i = lease.part(node)
        if lease.parts[i].outcome:
            raise _Refused("fenced", "node", f"the part of job {lease.job!r} on "
                           f"{lease.parts[i].node!r} was released ({lease.parts[i].outcome})")
        return lease, i

    def _drop(self, job: str) -> None:
        lease = self.leases.pop(job, None)
        if lease is not None:
            for r in lease.resources:
                if self.owner.get(r) == job:
                    del self.owner[r]

    # --- reads ------------------------------------------------------------------------------

    def holder_of(self, node: str, gpu: str, at: float) -> Lease | None:
        """The live lease covering ``node``'s ``gpu`` at ``at``, if any."""
        job = self.owner.get(f"{node}/{gpu}")
        lease = self.leases.get(job) if job is not None else None
        return lease if lease is not None and lease.live(max(at, self.now)) else None

    # --- snapshots --------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {"format": SNAPSHOT_FORMAT, "token": self.token, "now": self.now,
                "leases": [[lease.job, lease.holder, lease.token, lease.granted_at, lease.ttl,
                            lease.progress, lease.step, lease.outcome,
                            [[p.node, list(p.gpus), p.expires_at, p.renewals, p.outcome]
                             for p in lease.parts]]
                           for lease in self.leases.values()]}

    @classmethod
    def restore(cls, data: dict[str, Any]) -> LeaseTable:
        if data.get("format") not in (1, SNAPSHOT_FORMAT):
            raise ValueError(f"lease snapshot format {data.get('format')!r} is not "
                             f"{SNAPSHOT_FORMAT}")
        table = cls()
        table.token, table.now = int(data["token"]), float(data["now"])
        for row in data["leases"]:
            if data["format"] == 1:  # one part per lease
                job, holder, node, gpus, token, granted, expires, ttl, renewals, progress, \
                    step = row
                row = [job, holder, token, granted, ttl, progress, step, "",
                       [[node, gpus, expires, renewals, ""]]]
            job, holder, token, granted, ttl, progress, step, outcome, parts = row
            lease = Lease(job, holder, tuple(Part(n, tuple(g), float(e), int(r), o)
                                             for n, g, e, r, o in parts),
                          int(token), float(granted), float(ttl), float(progress), int(step),
                          outcome)
            table.leases[job] = lease
            for r in lease.resources:
                table.owner[r] = job
        return table


_OPS = {"acquire": LeaseTable._acquire, "renew": LeaseTable._renew,
        "release": LeaseTable._release, "expire": LeaseTable._expire}


_AT = Number(ge=0)
_NAME = Text(1, 256)
_GPUS = ListOf(Text(1, 128), unique=False)  # duplicates are refused naming "gpus" itself
_PARTS = ListOf(Object({"node": required(_NAME, "the part's node"),
                         "gpus": Field(_GPUS, [], "its GPUs; [] = a CPU slot")}),
                max_len=256, unique=False)
_TTL = Number(gt=0, le=MAX_TTL)
_PROGRESS = Number(ge=0, le=1)
_STEP = Integer(ge=0)
_TOKEN = Integer(ge=1)
_OUTCOME = Choice(OUTCOMES)


class _Refused(Exception):
    """A valid command the table's state refuses (``held``, ``busy``, ``fenced``,
    ``expired``, ``live``)."""

    def __init__(self, code: str, field: str, message: str) -> None:
        super().__init__(code, field, message)
        self.code, self.field, self.message = code, field, message


def _error(code: str, field: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": code, "field": field, "message": message}


HEDGE_AFTER = 1.0
"""Seconds a renewal may go unanswered before :class:`LeaseKeeper` sends another.  A healthy
placements group commits in milliseconds, and a voter that knows there is no leader says so
at once; this is well inside the 4 s a default lease (5 s ttl, 1 s margin) runs per grant."""
MAX_IN_FLIGHT = 3
"""Unanswered renewals a keeper lets out at once."""


class LeaseKeeper:
    """The trainer's side of one lease: when to renew, and when to stop the job on its own.

    Pure: every method takes the trainer's monotonic clock.  The job may run only while
    :meth:`may_run` holds, which ends ``ttl - margin`` after the *sending* of the last renewal
    the table granted - never later than the table's own expiry, whatever the network did to
    the reply (see the module docstring).  A trainer cut off from the coordinators therefore
    kills its job before the table can give the GPUs to another copy.

    The trainer learns of a grant from the table, with no send time of its own to count
    from, so it starts the job only after its first renewal is granted: that renewal is the
    "first progress" the grant's ``start_timeout`` waits for.

    **Hedged renewals.**  A renewal can hang at a coordinator that stalled (a paused VM, a
    long GC) with its connection still up, until its RPC deadline - longer than the slack
    before the keeper's deadline.  So while one is unanswered for ``hedge_after`` seconds
    another goes out (the forwarding layer sends it to another coordinator: see
    ``ControlPlane._pick_coordinator``), up to :data:`MAX_IN_FLIGHT`.  Safety is unchanged:
    each grant counts from the sending of the renewal it answers.
    """

    def __init__(self, token: int, ttl: float, margin: float = 1.0,
                 hedge_after: float = HEDGE_AFTER) -> None:
        if not 0 <= margin < ttl:
            raise ValueError("margin must be >= 0 and shorter than ttl")
        self.token = token
        self.ttl = ttl
        self.margin = margin
        self.hedge_after = hedge_after
        self.deadline = -math.inf
        """Until when (trainer clock) the job may run on what the table has granted."""
        self.fenced = False
        """The table refused a renewal (``fenced``/``expired``): stop for good."""
        self.in_flight: list[float] = []
        """Send times of the renewals not answered yet."""

    def may_run(self, now: float) -> bool:
        return not self.fenced and now < self.deadline

    def renew_at(self, now: float) -> float:
        """When to send the next renewal: at once before the first grant, then a third of the
        way into each granted period, so two more tries fit before the deadline; while one is
        unanswered, ``hedge_after`` after the latest sent."""
        if len(self.in_flight) >= MAX_IN_FLIGHT:
            return math.inf
        due = now if self.deadline == -math.inf else (
            self.deadline - (self.ttl - self.margin) * 2 / 3)
        if self.in_flight:
            due = max(due, max(self.in_flight) + self.hedge_after)
        return due

    def sent(self, now: float) -> None:
        """A renewal went out at ``now``; each one ends in :meth:`granted`, :meth:`refused` or
        :meth:`unanswered` with the same time."""
        self.in_flight.append(now)

    def granted(self, sent_at: float) -> None:
        """The table granted a renewal sent at ``sent_at``."""
        self._answered(sent_at)
        if not self.fenced:
            self.deadline = max(self.deadline, sent_at + self.ttl - self.margin)

    def refused(self, error: str, sent_at: float | None = None) -> None:
        """The table refused a renewal; ``fenced`` and ``expired`` end the lease for good (other
        errors - no quorum, no leader - leave the deadline as it is)."""
        if sent_at is not None:
            self._answered(sent_at)
        if error in ("fenced", "expired"):
            self.fenced = True

    def unanswered(self, sent_at: float) -> None:
        """The renewal sent at ``sent_at`` got no answer (an error, a timeout): it may still be
        applied, which only ever extends the table's expiry."""
        self._answered(sent_at)

    def _answered(self, sent_at: float) -> None:
        if sent_at in self.in_flight:
            self.in_flight.remove(sent_at)
