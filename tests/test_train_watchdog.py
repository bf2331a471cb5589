"""The job watchdog: a real process between a (here: scripted) trainer and a real job.

It must kill the job, and the job's own children, when the last deadline passes or the
trainer goes away - the trainer may be frozen and unable to do it - and stop it gracefully
(SIGTERM, then SIGKILL after the grace) when asked.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshd.train.watchdog import Switch

posix = pytest.mark.skipif(sys.platform == "win32", reason="process groups are POSIX")

# The job: starts a grandchild, records both pids, then works (sleeps) for a long time.
JOB = """
import os, signal, subprocess, sys, time
from pathlib import Path
out = Path(sys.argv[1])
if len(sys.argv) > 2 and sys.argv[2] == "term":
    def _term(*_):
        out.with_suffix(".term").write_text("1")
        sys.exit(143)
    signal.signal(signal.SIGTERM, _term)
if len(sys.argv) > 2 and sys.argv[2] == "stubborn":
    signal.signal(signal.SIGTERM, lambda *_: None)
kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
out.write_text(f"{os.getpid()} {kid.pid}")
seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 60
time.sleep(seconds)
sys.exit(0)
"""


def start(tmp: Path, *job_args: str) -> subprocess.Popen[bytes]:
    script = tmp / "job.py"
    script.write_text(JOB)
    env = {**os.environ, "MESHD_TRAINER_PID": str(os.getpid())}
    return subprocess.Popen([sys.executable, "-m", "meshd.train.watchdog", sys.executable,
                             str(script), str(tmp / "pids"), *job_args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                            start_new_session=True)


def tell(proc: subprocess.Popen[bytes], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line.encode() + b"\n")
    proc.stdin.flush()


def pids(tmp: Path, timeout: float = 10.0) -> list[int]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        text = (tmp / "pids").read_text() if (tmp / "pids").exists() else ""
        if len(text.split()) == 2:
            return [int(p) for p in text.split()]
        time.sleep(0.02)
    raise AssertionError("the job never started")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def gone(pid_list: list[int], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not any(alive(p) for p in pid_list):
            return True
        time.sleep(0.01)
    return False


@posix
def test_the_job_and_its_children_die_when_the_deadline_passes(tmp_path: Path) -> None:
    proc = start(tmp_path)
    deadline = time.monotonic() + 2.0
    tell(proc, f"deadline {deadline!r}")
    job, kid = pids(tmp_path)
    tell(proc, f"deadline {deadline - 1!r}")  # never shortened
    time.sleep(max(0.0, deadline - time.monotonic() - 0.3))
    assert alive(job) and alive(kid), "killed before its deadline"
    assert gone([job, kid], 0.3 + 0.5), "still running 0.5 s after its deadline"
    assert proc.wait(5) != 0
    assert b"the lease deadline passed" in (proc.stdout.read() if proc.stdout else b"")


@posix
def test_renewed_deadlines_keep_it_running_and_the_exit_code_is_the_jobs(tmp_path: Path) -> None:
    proc = start(tmp_path, "plain", "1.5")
    for _ in range(6):  # each deadline 0.6 s ahead, renewed every 0.4 s: 2.4 s of running
        tell(proc, f"deadline {time.monotonic() + 0.6!r}")
        time.sleep(0.4)
        if proc.poll() is not None:
            break
    assert proc.wait(5) == 0


@posix
def test_a_trainer_that_goes_away_takes_the_job_with_it(tmp_path: Path) -> None:
    proc = start(tmp_path)
    tell(proc, f"deadline {time.monotonic() + 60!r}")
    job, kid = pids(tmp_path)
    assert proc.stdin is not None
    proc.stdin.close()  # what the trainer's death does to the pipe
    assert gone([job, kid], 1.0)
    assert proc.wait(5) != 0


@posix
def test_stop_is_sigterm_then_sigkill_after_the_grace(tmp_path: Path) -> None:
    proc = start(tmp_path, "term")
    tell(proc, f"deadline {time.monotonic() + 60!r}")
    job, _ = pids(tmp_path)
    tell(proc, "stop 5")
    assert proc.wait(5) == 143 and (tmp_path / "pids.term").exists()

    stubborn = tmp_path / "b"
    stubborn.mkdir()
    proc = start(stubborn, "stubborn")
    tell(proc, f"deadline {time.monotonic() + 60!r}")
    job, kid = pids(stubborn)
    t0 = time.monotonic()
    tell(proc, "stop 0.5")
    assert gone([job, kid], 3.0)
    assert time.monotonic() - t0 >= 0.45, "SIGKILL came before the grace was up"
    proc.wait(5)


@posix
def test_no_job_starts_without_a_live_deadline(tmp_path: Path) -> None:
    proc = start(tmp_path)
    tell(proc, f"deadline {time.monotonic() - 1!r}")
    assert proc.wait(5) != 0
    assert not (tmp_path / "pids").exists()


@given(st.lists(st.text(max_size=40), max_size=20))
def test_switch_ignores_what_is_not_a_command(lines: list[str]) -> None:
    switch = Switch()
    for line in lines:
        switch.feed(line)
    assert switch.deadline == -math.inf or math.isfinite(switch.deadline)
    assert switch.stop_grace is None or switch.stop_grace >= 0
    switch.feed("deadline 12.5")
    switch.feed("deadline 3")
    assert switch.deadline >= 12.5


PARENT = """
import os, subprocess, sys, time
env = {**os.environ, "MESHD_TRAINER_PID": str(os.getpid())}
wd = subprocess.Popen([sys.executable, "-m", "meshd.train.watchdog", *sys.argv[1:]],
                      stdin=subprocess.PIPE, env=env, start_new_session=True)
wd.stdin.write(f"deadline {time.monotonic() + 60!r}\\n".encode())
wd.stdin.flush()
time.sleep(60)
"""


@posix
def test_a_trainer_killed_with_sigkill_takes_the_job_with_it(tmp_path: Path) -> None:
    """The job prints nothing (no broken pipe to end it): only the watchdog can stop it."""
    script = tmp_path / "job.py"
    script.write_text(JOB)
    parent = subprocess.Popen([sys.executable, "-c", PARENT, sys.executable, str(script),
                               str(tmp_path / "pids")])
    try:
        job, kid = pids(tmp_path)
        parent.kill()
        parent.wait()
        assert gone([job, kid], 1.0), "the job outlived its trainer"
    finally:
        parent.kill()
