"""Record client histories against the replicated policy store and check them for linearizability.

Not a test module.  Chaos tests kill the Raft leader over and over while clients keep reading and
writing, and then need to know whether what the clients saw could have come from a single correct
copy of the store.  Looking at the final state alone misses stale reads and writes that came back
from the dead, so each client records every operation::

    h = History()
    op = h.invoke("c3", "write", "policy/a", "c3-17")   # before sending the request
    try:
        version = client.put("policy/a", "c3-17")
    except Refused:          # validation/conflict: definitely not proposed
        h.fail(op)
    except Timeout:          # leader died, connection lost: may apply now, later or never
        h.unknown(op)
    else:
        h.ok(op, version)

    result = check(h.operations())          # the full Wing & Gong / Lowe search
    assert result.ok, result.explanation
    assert check_monotonic(h.operations()).ok  # cheaper necessary conditions, clearer messages
    assert not lost_writes(h.operations(), final_state)

The store model.  Every successful write bumps a store-wide version counter and the key records
that version, so per key the versions of successive writes strictly increase but are not
consecutive.  The model state of one key is ``(value, version)``, initially ``(None, 0)``:

* ``write(key, value)``: ``arg`` is the value; ``ok`` result is the new version (an ``int``).
* ``read(key)``: ``arg`` is ``None``; ``ok`` result is ``(value, version)``; ``(None, 0)`` = absent.
* ``cas(key, expected_version, value)``: ``arg`` is ``(expected_version, value)``; ``ok`` result is
  the new version; ``fail`` is a conflict.

``fail`` means definitely not applied and the operation is dropped (a failed read carries no
information either).  ``unknown`` means the write may take effect at any moment after its
invocation, or never; its return time is ``math.inf``.  An operation still pending when
:meth:`History.operations` is called is reported as unknown.

Every write must carry a value unique on its key (e.g. ``"c3-17"``) and values must be hashable.
That is what makes an unknown write checkable: a read returning ``("c3-17", 42)`` identifies the
write and tells us the version it got.  An unknown write that no read ever observed can be left
out entirely, since taking effect without being seen only constrains the history more.

Keys are independent registers, so the search is run per key (linearizability is compositional),
which keeps it fast for histories of thousands of operations.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

Kind = Literal["read", "write", "cas"]
Status = Literal["ok", "fail", "unknown"]
KINDS: tuple[str, ...] = ("read", "write", "cas")
STATUSES: tuple[str, ...] = ("ok", "fail", "unknown")

#: The state of a key nobody has written: absent, version 0.
ABSENT: tuple[Any, int] = (None, 0)

DEFAULT_MAX_STEPS = 1_000_000


@dataclass(frozen=True, slots=True)
class Operation:
    """One completed (or abandoned) client operation.

    ``call`` and ``ret`` are clock readings in nanoseconds taken before the request was sent and
    after the response arrived, so the real operation happened inside ``[call, ret]``.  ``ret`` is
    ``math.inf`` for ``unknown`` operations, which may take effect at any later time.
    """

    id: int
    client: Hashable
    kind: Kind
    key: str
    arg: Any
    result: Any
    status: Status
    call: int
    ret: float

    @property
    def value(self) -> Any:
        """The value a write or cas tries to store (``None`` for reads)."""
        if self.kind == "write":
            return self.arg
        if self.kind == "cas":
            return self.arg[1]
        return None

    def describe(self, t0: int = 0) -> str:
        """A one-line human description, with times in ms relative to ``t0``."""
        if self.kind == "write":
            what = f"write({self.arg!r})"
        elif self.kind == "cas":
            what = f"cas(expected={self.arg[0]!r}, {self.arg[1]!r})"
        else:
            what = "read()"
        outcome = f"ok {self.result!r}" if self.status == "ok" else self.status
        end = "inf" if math.isinf(self.ret) else f"{(self.ret - t0) / 1e6:.3f}ms"
        return (
            f"#{self.id} client {self.client!r} {what} on {self.key!r} -> {outcome} "
            f"[{(self.call - t0) / 1e6:.3f}ms, {end}]"
        )


@dataclass(frozen=True, slots=True)
class Invocation:
    """The token :meth:`History.invoke` hands out; pass it back to ok/fail/unknown."""

    id: int
    client: Hashable
    kind: Kind
    key: str
    arg: Any
    call: int


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The verdict of a checker.

    ``ok`` is False both for a proven violation and for an ``inconclusive`` search (budget
    exhausted): a chaos test asserting ``result.ok`` must not silently pass when the checker
    gave up, but the explanation says which of the two happened.
    """

    ok: bool
    key: str | None
    explanation: str
    inconclusive: bool = False
    steps: int = 0


class History:
    """A thread-safe recorder of client operations.

    ``clock`` is injectable so tests can use a deterministic fake; the default,
    ``time.monotonic_ns``, is what real multi-threaded clients must use (one process, one clock).
    Reading the clock before the request and after the response only ever widens an operation's
    interval, which keeps the check sound.
    """

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._pending: dict[int, Invocation] = {}
        self._done: dict[int, Operation] = {}

    def invoke(self, client: Hashable, kind: Kind, key: str, arg: Any = None) -> Invocation:
        """Record that ``client`` is about to send an operation; call before sending it."""
        if kind not in KINDS:
            raise ValueError(f"unknown operation kind {kind!r}")
        if kind == "cas" and not (isinstance(arg, tuple | list) and len(arg) == 2):
            raise ValueError("cas arg must be (expected_version, value)")
        if kind == "cas":
            arg = tuple(arg)
        call = self._clock()
        with self._lock:
            token = Invocation(next(self._ids), client, kind, key, arg, call)
            self._pending[token.id] = token
        return token

    def ok(self, op: Invocation, result: Any) -> None:
        """The operation succeeded: a version for write/cas, ``(value, version)`` for read."""
        if op.kind == "read":
            if not (isinstance(result, tuple | list) and len(result) == 2):
                raise ValueError(f"read result must be (value, version), got {result!r}")
            result = tuple(result)
        elif not isinstance(result, int) or isinstance(result, bool):
            raise ValueError(f"{op.kind} result must be the new version (int), got {result!r}")
        self._complete(op, "ok", result, self._clock())

    def fail(self, op: Invocation) -> None:
        """The operation was definitely not applied (refused before it was proposed)."""
        self._complete(op, "fail", None, self._clock())

    def unknown(self, op: Invocation) -> None:
        """The outcome is unknown (timeout, lost connection): it may apply now, later or never."""
        self._complete(op, "unknown", None, math.inf)

    def _complete(self, op: Invocation, status: Status, result: Any, ret: float) -> None:
        with self._lock:
            if self._pending.pop(op.id, None) is None:
                raise ValueError(f"operation #{op.id} completed twice or never invoked")
            self._done[op.id] = Operation(
                op.id, op.client, op.kind, op.key, op.arg, result, status, op.call, ret
            )

    def operations(self) -> list[Operation]:
        """A snapshot of all operations in invocation order; still-pending ones count as unknown.

        A pending operation is exactly an unknown one as far as anyone can tell: it was sent and
        may or may not have taken effect.
        """
        with self._lock:
            ops = list(self._done.values())
            ops.extend(
                Operation(p.id, p.client, p.kind, p.key, p.arg, None, "unknown", p.call, math.inf)
                for p in self._pending.values()
            )
        ops.sort(key=lambda o: o.id)
        return ops


# --------------------------------------------------------------------------------------------
# Static checks shared by check() and check_monotonic()


def _validate(ops: Iterable[Operation]) -> list[Operation]:
    """Reject malformed histories: a harness bug must not look like a store bug, or vice versa."""
    out = list(ops)
    seen_values: dict[tuple[str, Any], Operation] = {}
    for op in out:
        if op.kind not in KINDS or op.status not in STATUSES:
            raise ValueError(f"bad operation {op!r}")
        if op.ret < op.call:
            raise ValueError(f"operation returns before it is called: {op!r}")
        if op.status == "ok":
            if op.kind == "read":
                if not (isinstance(op.result, tuple) and len(op.result) == 2):
                    raise ValueError(f"read result must be a (value, version) tuple: {op!r}")
            elif not isinstance(op.result, int):
                raise ValueError(f"{op.kind} result must be an int version: {op!r}")
        if op.kind == "cas" and not (isinstance(op.arg, tuple) and len(op.arg) == 2):
            raise ValueError(f"cas arg must be (expected_version, value): {op!r}")
        if op.kind != "read":
            prior = seen_values.setdefault((op.key, op.value), op)
            if prior is not op:
                raise ValueError(
                    f"value {op.value!r} written twice on {op.key!r} (#{prior.id}, #{op.id}); "
                    "the checker needs a unique value per write to identify unknown writes"
                )
    return out


def _by_key(ops: Iterable[Operation]) -> dict[str, list[Operation]]:
    groups: dict[str, list[Operation]] = defaultdict(list)
    for op in ops:
        groups[op.key].append(op)
    return groups


def _initial(initial: Mapping[str, tuple[Any, int]] | None, key: str) -> tuple[Any, int]:
    value, version = (initial or {}).get(key, ABSENT)
    return (value, version)


def _t0(ops: list[Operation]) -> int:
    return min((op.call for op in ops), default=0)


def _static_violations(
    key: str, ops: list[Operation], initial: tuple[Any, int], t0: int
) -> list[tuple[float, str]]:
    """Violations visible without any search, as ``(time, explanation)``.

    They are all implied by linearizability of the register model, so reporting them first only
    buys clearer messages (the search would fail too, with a vaguer story).
    """
    writers: dict[Any, Operation] = {op.value: op for op in ops if op.kind != "read"}
    reads = [op for op in ops if op.kind == "read" and op.status == "ok"]
    problems: list[tuple[float, str]] = []
    # version -> (value, the op that showed it); value -> (version, op)
    by_version: dict[int, tuple[Any, Operation | None]] = {initial[1]: (initial[0], None)}
    by_value: dict[Any, tuple[int, Operation | None]] = {initial[0]: (initial[1], None)}

    def note(value: Any, version: int, op: Operation) -> None:
        known = by_version.setdefault(version, (value, op))
        if known[0] != value:
            other = known[1].describe(t0) if known[1] else "the initial state"
            problems.append(
                (
                    op.call,
                    f"key {key!r}: two values share version {version}: "
                    f"{value!r} from {op.describe(t0)} and {known[0]!r} from {other}",
                )
            )
        seen = by_value.setdefault(value, (version, op))
        if seen[0] != version:
            other = seen[1].describe(t0) if seen[1] else "the initial state"
            problems.append(
                (
                    op.call,
                    f"key {key!r}: value {value!r} has two versions: {version} in "
                    f"{op.describe(t0)} and {seen[0]} in {other}; one write makes one version",
                )
            )

    for op in ops:
        if op.kind != "read" and op.status == "ok":
            note(op.value, op.result, op)
            if op.kind == "cas" and op.result <= op.arg[0]:
                problems.append(
                    (
                        op.call,
                        f"key {key!r}: {op.describe(t0)} got a version not above the "
                        f"expected {op.arg[0]}",
                    )
                )
    for op in sorted(reads, key=lambda o: o.call):
        value, version = op.result
        if (value, version) == initial:
            continue
        writer = writers.get(value)
        if writer is None:
            problems.append(
                (op.call, f"key {key!r}: {op.describe(t0)} returned a value nobody ever wrote")
            )
            continue
        if writer.status == "fail":
            problems.append(
                (
                    op.call,
                    f"key {key!r}: {op.describe(t0)} observed the value of "
                    f"{writer.describe(t0)}, which failed and so was never applied",
                )
            )
            continue
        if version <= 0:
            problems.append(
                (
                    op.call,
                    f"key {key!r}: {op.describe(t0)} returned a written value with "
                    f"version {version}",
                )
            )
        if op.ret < writer.call:
            problems.append(
                (
                    op.call,
                    f"key {key!r}: {op.describe(t0)} returned before the write of its "
                    f"value was even invoked: {writer.describe(t0)}",
                )
            )
        note(value, version, op)
    return problems


# --------------------------------------------------------------------------------------------
# The WGL search


_READ, _WRITE, _CAS = 0, 1, 2
_State = tuple[Any, int]  # (value, version) of one key


@dataclass(frozen=True, slots=True)
class _Step:
    """One operation as the model sees it."""

    code: int
    value: Any
    version: int
    expected: int = 0
    after: int = -1  # index of the write that must be linearized first, see _model_steps
    # A cas whose expected version may belong to a dropped invisible write, see _model_steps.
    may_follow_invisible: bool = False


def _apply(state: _State, step: _Step) -> _State | None:
    """The register model: the next state, or None if ``step`` cannot happen in ``state``."""
    value, version = state
    if step.code == _READ:
        return state if version == step.version and value == step.value else None
    if step.code == _CAS and version != step.expected:
        if not (step.may_follow_invisible and version < step.expected):
            return None
        version = step.expected
    if step.version <= version:
        return None
    return (step.value, step.version)


def _model_steps(
    ops: list[Operation], initial: tuple[Any, int]
) -> tuple[list[Operation], list[_Step]]:
    """Turn a key's operations into model steps, dropping those that cannot matter.

    Failed operations never happened and unknown reads say nothing.  An unknown write whose value
    no read returned is "invisible" and dropped: given a valid linearization with it, removing it
    leaves a valid one, because no read depends on it and the versions around it still increase.
    That keeps the search from trying every subset of them at every point.  The one thing such
    a write can enable is a cas that expects its (never observed) version; so a cas may also
    succeed from a lower version when an invisible write was invoked before the cas must have
    taken effect (when it returned, or when a read first returned its value).
    That is slightly permissive (it never rejects a valid history) and only arises when a client
    guesses a version it never read.

    Every remaining unknown write was observed, so the read tells its version.
    """
    observed: dict[Any, int] = {}
    seen_by: dict[Any, float] = {}  # value -> when the first read of it returned
    for op in ops:
        if op.kind == "read" and op.status == "ok":
            observed.setdefault(op.result[0], op.result[1])
            seen_by[op.result[0]] = min(op.ret, seen_by.get(op.result[0], math.inf))
    invisible_calls = [
        op.call
        for op in ops
        if op.kind != "read" and op.status == "unknown" and op.value not in observed
    ]
    first_invisible = min(invisible_calls, default=math.inf)
    kept: list[Operation] = []
    steps: list[_Step] = []
    for op in ops:
        if op.status == "fail" or (op.kind == "read" and op.status != "ok"):
            continue
        if op.kind == "read":
            step = _Step(_READ, op.result[0], op.result[1])
        else:
            version = op.result if op.status == "ok" else observed.get(op.value)
            if version is None:
                continue  # invisible
            if op.kind == "write":
                step = _Step(_WRITE, op.value, version)
            else:
                deadline = min(op.ret, seen_by.get(op.value, math.inf))
                follows = first_invisible <= deadline
                step = _Step(_CAS, op.value, version, op.arg[0], may_follow_invisible=follows)
        kept.append(op)
        steps.append(step)
    # Every remaining write must be linearized (an ok one by definition, an unknown one because a
    # read saw its value) and versions grow along the order, so they go in version order.
    # Chaining each to its predecessor cuts the search from exponential to near-linear when many
    # writes overlap, without losing any valid linearization.
    chain = sorted((s.version, i) for i, s in enumerate(steps) if s.code != _READ)
    for (_, before), (_, i) in itertools.pairwise(chain):
        steps[i] = replace(steps[i], after=before)
    return kept, steps


@dataclass
class _Outcome:
    ok: bool | None  # None: budget exhausted
    steps: int
    explanation: str = ""


def _search(
    key: str,
    ops: list[Operation],
    steps: list[_Step],
    initial: tuple[Any, int],
    max_steps: int,
    t0: int,
) -> _Outcome:
    """Wing & Gong's search with Lowe's memoization, as in Porcupine and Knossos.

    Call and return events sit in a doubly linked list ordered by time.  Walking it, any call
    before the first remaining return may be linearized next (its operation is minimal in the
    real-time order); linearizing lifts its call and return out of the list.  Reaching a return
    means that operation should have been linearized already, so we backtrack.  A
    ``(linearized set, state)`` pair already explored is never explored again, which is what
    makes this practical.  Unknown operations return at +inf: reaching one of their returns
    means every definite operation is placed, and the rest are free to never take effect.
    """
    n = len(ops)
    if n == 0:
        return _Outcome(True, 0)
    # Node 0 is the head; node 2i+1 is op i's call and 2i+2 its return.  Calls sort before
    # returns at the same instant, so touching intervals count as concurrent (the safe choice).
    events = sorted(
        [(op.call, 0, 2 * i + 1) for i, op in enumerate(ops)]
        + [(op.ret, 1, 2 * i + 2) for i, op in enumerate(ops)]
    )
    order = [0] + [node for _, _, node in events]
    nxt = [-1] * (2 * n + 1)
    prv = [-1] * (2 * n + 1)
    for a, b in itertools.pairwise(order):
        nxt[a], prv[b] = b, a

    def lift(call: int) -> None:
        for node in (call, call + 1):
            nxt[prv[node]] = nxt[node]
            if nxt[node] != -1:
                prv[nxt[node]] = prv[node]

    def unlift(call: int) -> None:
        for node in (call + 1, call):
            nxt[prv[node]] = node
            if nxt[node] != -1:
                prv[nxt[node]] = node

    state: _State = initial
    linearized = 0
    stack: list[tuple[int, _State]] = []
    seen: set[tuple[int, _State]] = set()
    best_depth = -1
    best: tuple[list[int], _State, int, list[int]] = ([], state, 0, [])
    count = 0
    entry = nxt[0]
    while entry != -1:  # -1: the list is empty, every operation is placed
        count += 1
        if count > max_steps:
            return _Outcome(None, count)
        if entry & 1:  # a call
            i = entry >> 1
            step = steps[i]
            if step.after >= 0 and not linearized >> step.after & 1:
                entry = nxt[entry]
                continue
            new_state = _apply(state, step)
            if new_state is not None:
                new_linearized = linearized | (1 << i)
                memo = (new_linearized, new_state)
                if memo not in seen:
                    seen.add(memo)
                    stack.append((entry, state))
                    state, linearized = new_state, new_linearized
                    lift(entry)
                    entry = nxt[0]
                    continue
            entry = nxt[entry]
            continue
        i = (entry >> 1) - 1
        if math.isinf(ops[i].ret):
            return _Outcome(True, count)
        if len(stack) > best_depth:
            best_depth = len(stack)
            candidates = []
            node = nxt[0]
            while node != entry:
                candidates.append(node >> 1)
                node = nxt[node]
            best = ([c >> 1 for c, _ in stack], state, i, candidates)
        if not stack:
            return _Outcome(False, count, _explain(key, ops, best, t0))
        entry, state = stack.pop()
        linearized &= ~(1 << (entry >> 1))
        unlift(entry)
        entry = nxt[entry]
    return _Outcome(True, count)


def _explain(
    key: str, ops: list[Operation], best: tuple[list[int], _State, int, list[int]], t0: int
) -> str:
    """Describe the deepest point the search reached, like Porcupine's partial linearizations."""
    prefix, (value, version), blocked, candidates = best
    state = f"(value={value!r}, version={version})"
    lines = [
        f"key {key!r}: not linearizable ({len(ops)} relevant operations).",
        f"The longest linearizable prefix places {len(prefix)} of them, leaving state {state}.",
    ]
    for i in prefix[-3:]:
        lines.append(f"  ... linearized {ops[i].describe(t0)}")
    lines.append(
        f"Then {ops[blocked].describe(t0)} must take effect before it returned, but no "
        "operation that may come next fits the state. Candidates were:"
    )
    for i in candidates[:8]:
        lines.append(f"  {ops[i].describe(t0)}")
    if len(candidates) > 8:
        lines.append(f"  ... and {len(candidates) - 8} more")
    return "\n".join(lines)


def check(
    history_ops: Iterable[Operation],
    *,
    initial: Mapping[str, tuple[Any, int]] | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> CheckResult:
    """Decide whether the history is linearizable for a per-key versioned register.

    ``initial`` gives keys that existed before recording started (default: absent, version 0).
    ``max_steps`` bounds the search per key; when exceeded the result is inconclusive
    (``ok=False, inconclusive=True``) rather than a hang.
    """
    ops = _validate(history_ops)
    t0 = _t0(ops)
    total = 0
    gave_up: list[str] = []
    for key, key_ops in sorted(_by_key(ops).items(), key=lambda kv: str(kv[0])):
        init = _initial(initial, key)
        static = _static_violations(key, key_ops, init, t0)
        if static:
            return CheckResult(False, key, min(static)[1], steps=total)
        kept, steps = _model_steps(key_ops, init)
        outcome = _search(key, kept, steps, init, max_steps, t0)
        total += outcome.steps
        if outcome.ok is None:
            gave_up.append(key)
        elif not outcome.ok:
            return CheckResult(False, key, outcome.explanation, steps=total)
    if gave_up:
        return CheckResult(
            False,
            gave_up[0],
            f"inconclusive: the search exceeded {max_steps} steps on key(s) {gave_up!r}; "
            "no violation was proven (raise max_steps or record shorter runs)",
            inconclusive=True,
            steps=total,
        )
    return CheckResult(True, None, f"linearizable ({len(ops)} operations)", steps=total)


# --------------------------------------------------------------------------------------------
# Cheaper checks


def check_monotonic(
    ops: Iterable[Operation], *, initial: Mapping[str, tuple[Any, int]] | None = None
) -> CheckResult:
    """Necessary conditions for linearizability, each with a direct explanation.

    Per key: no read returns a (value, version) no write produced; no two values share a version;
    no value has two versions; and reads never go back in time: a read that starts after an
    acknowledged write (or another read) returned sees at least that version.  The last one
    covers a client's own successive reads and the visibility of every acknowledged write.
    Linear time, so it also works on histories too big for the full search.
    """
    all_ops = _validate(ops)
    t0 = _t0(all_ops)
    problems: list[tuple[float, str, str]] = []
    for key, key_ops in _by_key(all_ops).items():
        init = _initial(initial, key)
        for at, text in _static_violations(key, key_ops, init, t0):
            problems.append((at, str(key), text))
        # Sweep reads by start time over operations by return time, tracking the highest
        # version that was definitely in place before the read began.
        done = sorted((op for op in key_ops if op.status == "ok"), key=lambda o: o.ret)
        reads = sorted(
            (op for op in key_ops if op.kind == "read" and op.status == "ok"),
            key=lambda o: o.call,
        )
        floor, floor_op, j = -1, None, 0
        for read in reads:
            while j < len(done) and done[j].ret < read.call:
                d = done[j]
                v = d.result[1] if d.kind == "read" else d.result
                if v > floor:
                    floor, floor_op = v, d
                j += 1
            if floor_op is not None and read.result[1] < floor:
                if floor_op.kind == "read":
                    who = "its own" if floor_op.client == read.client else "an earlier"
                    why = f"after {who} read {floor_op.describe(t0)} had returned"
                else:
                    why = f"after the acknowledged write {floor_op.describe(t0)} had returned"
                problems.append(
                    (
                        read.call,
                        str(key),
                        f"key {key!r}: stale read {read.describe(t0)} saw version "
                        f"{read.result[1]}, but it started {why} (version {floor})",
                    )
                )
    if problems:
        at, key, text = min(problems)
        return CheckResult(False, key, text)
    return CheckResult(True, None, f"monotonic ({len(all_ops)} operations)")


def lost_writes(
    ops: Iterable[Operation],
    final_state: Mapping[str, tuple[Any, int]],
    *,
    missing_is_absent: bool = True,
) -> list[Operation]:
    """Acknowledged writes (and cas) that the final committed state no longer reflects.

    ``final_state`` maps key to ``(value, version)`` as read linearizably after the run.  A write
    acknowledged with version v is lost if the key's final version is below v, or equals v with
    a different value (the version was handed out twice, so that write is gone just the same).
    Keys missing from ``final_state`` count as absent unless ``missing_is_absent`` is False, in
    which case they are skipped (e.g. the final read did not cover them).
    """
    lost: list[Operation] = []
    for op in ops:
        if op.kind == "read" or op.status != "ok":
            continue
        if op.key not in final_state and not missing_is_absent:
            continue
        value, version = final_state.get(op.key, ABSENT)
        if version < op.result or (version == op.result and value != op.value):
            lost.append(op)
    lost.sort(key=lambda o: (o.call, o.id))
    return lost
