"""What every benchmark shares: the one table it prints (Markdown, so it pastes into notes as
is) and the machine description it records next to its results."""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def format_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep, *map(line, rows)])


def print_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    print(format_table(head, rows))


def machine_info() -> dict[str, Any]:
    """Python, OS and CPU of this run, for the JSON results."""
    model = ""
    try:
        for text in Path("/proc/cpuinfo").read_text().splitlines():
            if text.startswith("model name"):
                model = text.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"python": platform.python_version(), "implementation":
            platform.python_implementation(), "machine": platform.machine(),
            "system": platform.platform(), "cpu_count": os.cpu_count(), "cpu_model": model}


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages ([] where /proc is missing)."""
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return []


def machine_busy_s() -> float | None:
    """CPU seconds every process on the machine has used (user+nice+system+irq+softirq+steal
    from /proc/stat), to tell what other processes took during a measurement."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (and its reaped children) so far; None when gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class Others:
    """CPU the rest of the machine used during a measurement (others' jobs), in cores."""

    def __init__(self, ours: Callable[[], float]) -> None:
        self.ours = ours
        self.t0, self.busy0, self.ours0, self.load0 = (time.monotonic(), machine_busy_s(),
                                                       ours(), loadavg())

    def done(self) -> dict[str, Any]:
        wall = time.monotonic() - self.t0
        busy1 = machine_busy_s()
        ours = self.ours() - self.ours0
        other = None
        if self.busy0 is not None and busy1 is not None and wall > 0:
            other = max(0.0, busy1 - self.busy0 - ours) / wall
        return {"wall_s": wall, "our_cores": ours / max(wall, 1e-9), "other_cores": other,
                "loadavg_before": self.load0, "loadavg_after": loadavg()}


def quantile(ordered: list[float], q: float) -> float:
    """Nearest-rank quantile of a sorted non-empty list."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def distribution(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    if not s:
        return {"n": 0}
    return {"n": len(s), "min": s[0], "p50": quantile(s, 0.5), "p90": quantile(s, 0.9),
            "p99": quantile(s, 0.99), "p999": quantile(s, 0.999), "max": s[-1],
            "mean": statistics.fmean(s)}


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def git_state() -> dict[str, Any]:
    """The commit a result was measured at, and the files that differed from it."""
    root = Path(__file__).resolve().parent.parent

    def run(*cmd: str) -> str:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            return subprocess.run(["git", *cmd], cwd=root, capture_output=True, text=True,
                                  timeout=10).stdout
        return ""

    dirty = [line[3:] for line in run("status", "--porcelain").splitlines() if line.strip()]
    return {"commit": run("rev-parse", "HEAD").strip(), "dirty_files": dirty}


def publish(out: Path, benchmark: str, title: str, head: Sequence[str],
            rows: Sequence[Sequence[str]], started: float, quick: bool,
            setup: dict[str, Any], results: dict[str, Any], footer: str = "") -> None:
    """Print the table (with the machine and the wall time since ``started``, a
    ``perf_counter``) and write ``out`` (JSON: the run, its setup and results) and its ``.md``
    (the table)."""
    import json
    import sys

    print(f"\n{title} ({os.cpu_count()} CPUs, Python {platform.python_version()})\n")
    print_table(head, rows)
    wall = time.perf_counter() - started
    print(f"\nwall time {wall:.0f} s{'; ' + footer if footer else ''}")
    report = {"benchmark": benchmark, "quick": quick, "argv": sys.argv,
              "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **machine_info(),
              "loadavg_end": loadavg(), "git": git_state(), "wall_s": wall, "setup": setup,
              "table": [dict(zip(head, r, strict=True)) for r in rows], "results": results}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    out.with_suffix(".md").write_text(f"# {title}\n\n{format_table(head, rows)}\n")
    print(f"wrote {out}")
