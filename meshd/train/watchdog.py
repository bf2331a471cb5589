"""The job's dead man's switch: a small process between the trainer and the job.

``python -m meshd.train.watchdog ARGV...`` starts ``ARGV`` and kills it (SIGKILL, the whole
process group) when the lease deadline the trainer last wrote on its stdin passes.  Why a
separate process: the trainer's own :class:`LeaseKeeper` stops the job when renewals fail,
but a trainer that is *frozen* (SIGSTOP, a stalled VM, swap) cannot kill anything, while the
lease lapses at the coordinators and the job starts elsewhere.  The watchdog keeps counting
on the machine's monotonic clock (system-wide, so the trainer's deadlines mean the same
here) and fences the job on time whatever the trainer does.

The trainer writes one command per line on the watchdog's stdin:

* ``deadline T`` - the job may run until monotonic time ``T`` (only ever extended);
* ``stop G`` - a graceful stop: SIGTERM to the job's group, SIGKILL ``G`` seconds later
  (the job may checkpoint and exit; used for drain-migrate and cancel).

End of input means the trainer is gone: the job is killed at once.  On Linux the watchdog
also asks for SIGUSR1 when the trainer dies (``PR_SET_PDEATHSIG``), which means the same.
(Not SIGKILL: the watchdog must live long enough to kill the job's group, or the job would
run on, orphaned and unfenced.)  It exits with the job's exit code.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
POLL = 0.02
"""Seconds between deadline checks: how late past its deadline a job can be killed."""


class Switch:
    """What the trainer has said so far; the reader thread writes it, the main loop reads."""

    def __init__(self) -> None:
        self.deadline = -math.inf
        self.stop_grace: float | None = None
        self.closed = False
        self.lock = threading.Lock()

    def feed(self, line: str) -> None:
        word, _, arg = line.strip().partition(" ")
        try:
            value = float(arg)
        except ValueError:
            return  # not a command: ignored (only the trainer writes here)
        with self.lock:
            if word == "deadline" and math.isfinite(value):
                self.deadline = max(self.deadline, value)
            elif word == "stop" and value >= 0:
                self.stop_grace = value

    def read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.feed(line)
        self.gone()

    def gone(self) -> None:
        """The trainer is gone (end of input, or its death signal): kill the job now."""
        self.closed = True  # a plain store: also called from a signal handler, so no lock


def _signal_all(job: subprocess.Popen[bytes], hard: bool) -> None:
    """SIGKILL (``hard``) or SIGTERM to the job and everything it started: this process's
    group, so on POSIX a hard kill ends the watchdog too.  Windows: the job alone."""
    if sys.platform == "win32":
        (job.kill if hard else job.terminate)()
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(os.getpgid(0), signal.SIGKILL if hard else signal.SIGTERM)


def supervise(job: subprocess.Popen[bytes], switch: Switch) -> int:
    """Wait for the job, killing it when the deadline passes or the trainer goes."""
    term_at: float | None = None
    while True:
        try:
            return job.wait(POLL)
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        with switch.lock:
            deadline, grace, closed = switch.deadline, switch.stop_grace, switch.closed
        if closed or now >= deadline:
            why = "the trainer is gone" if closed else "the lease deadline passed"
            print(f'{{"message": "watchdog: {why}; job killed"}}', flush=True)
            _signal_all(job, hard=True)
            return job.wait()
        if grace is not None:
            if term_at is None:
                term_at = now
                _signal_all(job, hard=False)
            elif now - term_at >= grace:
                _signal_all(job, hard=True)
                return job.wait()


def main() -> None:
    argv = sys.argv[1:]
    if not argv:
        sys.exit("usage: python -m meshd.train.watchdog ARGV...  (commands on stdin)")
    parent = int(os.environ.pop("MESHD_TRAINER_PID", "0") or 0)
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGUSR1, 0, 0, 0) != 0:
            sys.exit(f"prctl(PR_SET_PDEATHSIG): errno {ctypes.get_errno()}")
        if parent and os.getppid() != parent:
            sys.exit("the trainer exited before the job started")
    if sys.platform != "win32":
        # A graceful stop signals the whole group; the watchdog itself stays to enforce the
        # grace (a handler, not SIG_IGN, so the job does not inherit ignoring SIGTERM).
        signal.signal(signal.SIGTERM, lambda *_: None)
    switch = Switch()
    if sys.platform != "win32":
        signal.signal(signal.SIGUSR1, lambda *_: switch.gone())
    first = sys.stdin.readline()
    switch.feed(first)
    if not first or time.monotonic() >= switch.deadline:
        sys.exit("watchdog: no live lease deadline before the start; job not started")
    reader = threading.Thread(target=switch.read, args=(sys.stdin,), daemon=True)
    reader.start()
    job = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    code = supervise(job, switch)
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
