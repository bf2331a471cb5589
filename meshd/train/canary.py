"""A canary job that records when and where it runs, so fencing can be audited.

Why: "two trainers never run one job, and one GPU never runs two jobs" is the promise the
leases make; a canary checks it from the outside, with nothing but files.  Each run appends
a heartbeat (wall-clock time) every ``beat`` seconds to ``run-<token>-<pid>.beats`` in its
``MESHD_CHECKPOINT_DIR``, after a header naming the job, token, node and slots (one lease
can have several runs: a trainer restarted while its lease is live starts the job again).
A run killed by fencing simply stops beating.  :func:`audit` then reads every run under a
directory and reports each overlap: two runs of one job, or two jobs on one (node, slot),
alive at once.

Run it as a job's ``entry``: ``meshd.train.canary:main``, hyperparameters ``seconds`` (how
long each attempt works, default 5) and ``beat`` (default 0.02).  The audit resolves
overlaps no finer than one beat, far below the lease margin it checks (1 s).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

DEFAULTS = {"seconds": 5.0, "beat": 0.02}


def main() -> int:
    hp = {**DEFAULTS, **json.loads(os.environ.get("MESHD_HPARAMS") or "{}")}
    directory = Path(os.environ.get("MESHD_CHECKPOINT_DIR") or ".")
    directory.mkdir(parents=True, exist_ok=True)
    token = int(os.environ.get("MESHD_LEASE_TOKEN", "0"))
    header = {"job": os.environ.get("MESHD_JOB_ID", ""), "token": token,
              "node": os.environ.get("MESHD_NODE", ""),
              "slots": [s for s in os.environ.get("MESHD_SLOTS", "").split(",") if s],
              "attempt": int(os.environ.get("MESHD_ATTEMPT", "0"))}
    seconds, beat = float(hp["seconds"]), float(hp["beat"])
    start = time.time()
    with (directory / f"run-{token:08d}-{os.getpid()}.beats").open("a") as out:
        out.write(json.dumps(header) + "\n")
        reported = 0.0
        while True:
            now = time.time()
            out.write(f"{now:.6f}\n")
            out.flush()
            if now - start >= seconds:
                break
            if now - reported >= 0.5:
                print(json.dumps({"progress": min(1.0, (now - start) / seconds)}), flush=True)
                reported = now
            time.sleep(beat)
    return 0


@dataclass(frozen=True)
class Run:
    """One run of a canary job: from its first heartbeat to its last."""

    job: str
    token: int
    node: str
    slots: tuple[str, ...]
    start: float
    end: float
    path: Path


def runs(root: Path) -> list[Run]:
    """Every canary run recorded under ``root`` (any depth)."""
    out = []
    for path in sorted(root.rglob("run-*.beats")):
        lines = path.read_text().splitlines()
        if len(lines) < 2:
            continue
        head = json.loads(lines[0])
        beats = [float(x) for x in lines[1:] if x.strip()]
        out.append(Run(head["job"], int(head["token"]), head["node"], tuple(head["slots"]),
                       min(beats), max(beats), path))
    return out


def audit(found: list[Run]) -> list[str]:
    """Every pair of runs that held one job, or one (node, slot), at the same time (the
    ranks of one gang - one token, on different nodes - are one run of the job)."""
    groups: dict[tuple[str, ...], list[Run]] = defaultdict(list)
    for r in found:
        groups[("job", r.job)].append(r)
        for s in r.slots:
            groups[("slot", r.node, s)].append(r)
    problems = []
    for key, members in sorted(groups.items()):
        members.sort(key=lambda r: r.start)
        for i, a in enumerate(members):
            for b in members[i + 1:]:
                if b.start >= a.end:
                    break
                if a.path != b.path and not (key[0] == "job" and a.token == b.token
                                             and a.node != b.node):  # a gang's ranks
                    problems.append(f"{'/'.join(key)}: {a.job}@{a.node} token {a.token} "
                                    f"[{a.start:.3f}, {a.end:.3f}] overlaps {b.job}@{b.node} "
                                    f"token {b.token} [{b.start:.3f}, {b.end:.3f}] by "
                                    f"{a.end - b.start:.3f}s")
    return problems


if __name__ == "__main__":
    sys.exit(main())
