"""Start a job's process so that it cannot outlive its trainer.

``python -m meshd.train.launch ARGV...`` asks Linux to SIGKILL it when the parent (the
trainer's meshd) dies, then execs ``ARGV``.  Without it a trainer killed with SIGKILL would
leave its job running, unfenced, while the lease lapses and another copy starts elsewhere.
(The death signal survives exec; elsewhere the job relies on the trainer's own kill.)
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main() -> None:
    argv = sys.argv[1:]
    if not argv:
        sys.exit("usage: python -m meshd.train.launch ARGV...")
    parent = int(os.environ.pop("MESHD_TRAINER_PID", "0") or 0)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            sys.exit(f"prctl(PR_SET_PDEATHSIG): errno {ctypes.get_errno()}")
        if parent and os.getppid() != parent:
            sys.exit("the trainer exited before the job started")
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
