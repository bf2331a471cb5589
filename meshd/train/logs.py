"""Where a trainer keeps each job's output, and reading it back for ``JobLogs``.

One file per attempt, ``<data dir>/jobs/<job id>/attempt-<n>.log``: an attempt is one lease,
so the output of a job that failed over is split by where and when it ran.  Logs stay on the
trainer that ran the attempt (they can be large, and the Raft log is no place for them);
``meshctl jobs logs`` asks each attempt's node.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_TAIL = 64 * 1024
MAX_TAIL = 4 * 1024 * 1024
"""Most bytes one ``JobLogs`` answer carries (the end of a longer log)."""


def log_path(workdir: Path, attempt: int) -> Path:
    return workdir / f"attempt-{attempt}.log"


def attempts(workdir: Path) -> list[int]:
    """The attempts with a log in ``workdir``, in order."""
    out = []
    for path in workdir.glob("attempt-*.log"):
        number = path.stem.removeprefix("attempt-")
        if number.isdigit():
            out.append(int(number))
    return sorted(out)


@dataclass(frozen=True)
class Tail:
    attempt: int
    data: bytes
    truncated: bool
    attempts: list[int]


def read_tail(workdir: Path, attempt: int = 0, tail: int = DEFAULT_TAIL) -> Tail | None:
    """The last ``tail`` bytes of ``attempt``'s log (0: the latest here); None if absent."""
    have = attempts(workdir)
    if not have or (attempt and attempt not in have):
        return None
    attempt = attempt or have[-1]
    with log_path(workdir, attempt).open("rb") as f:
        size = f.seek(0, 2)
        f.seek(max(0, size - tail))
        data = f.read(tail)
    return Tail(attempt, data, size > tail, have)
