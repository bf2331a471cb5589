"""Child processes that do not outlive their starter: the dev mesh's Triton servers, and the
agents, helpers and servers that tests and benches start.

One copy, here in the product's dev package because ``meshd.dev`` needs it and product code
cannot import ``testbed``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import threading
from typing import Any

_CHILDREN: set[subprocess.Popen[Any]] = set()
"""Every child handed to :func:`kill_at_exit`, killed at exit if still running (held strongly
on purpose)."""


def pdeathsig_prefix() -> list[str]:
    """``setpriv --pdeathsig KILL``, to put before a command: the kernel kills the child if the
    process that started it dies (Linux with ``setpriv``; elsewhere ``[]``).

    Not a ``preexec_fn``: forking a process that runs gRPC threads without exec'ing at once trips
    gRPC's fork handlers and the child aborts.  The signal fires when the *thread* that started
    the child exits, so the prefix is only given on the main thread (elsewhere ``[]``)."""
    if (sys.platform.startswith("linux") and shutil.which("setpriv")
            and threading.current_thread() is threading.main_thread()):
        return ["setpriv", "--pdeathsig", "KILL"]
    return []


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid`` (Linux: /proc; elsewhere [])."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) >= 3 and fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry))
    return found


def kill_at_exit(proc: subprocess.Popen[Any]) -> None:
    """Kill ``proc`` (SIGKILL) when this interpreter exits, if it is still running then."""
    _CHILDREN.add(proc)


@atexit.register
def _kill_children() -> None:
    for proc in list(_CHILDREN):
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
