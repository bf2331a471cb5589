"""A benchmark's helper process: this same script run with ``--<kind>-child SPEC``, answering
one JSON line per command on stdin.  Each process under measurement is its own so it owns its
CPU figures and its event loop, and a crash shows as a missing answer, not a hung bench."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def read_line(proc: subprocess.Popen[str], timeout: float, what: str,
              log: str) -> dict[str, Any]:
    """The next JSON line ``proc`` prints (RuntimeError if it exits or is silent too long)."""
    stdout = proc.stdout
    assert stdout is not None
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not box or not box[0]:
        raise RuntimeError(f"{what} said nothing in {timeout:.0f} s (exit {proc.poll()}); "
                           f"log {log}")
    return dict(json.loads(box[0]))


class Child:
    """``script --<kind>-child <spec as JSON>``; its first line (``addr``, ``pid``) is read at
    start."""

    def __init__(self, script: str | Path, kind: str, spec: dict[str, Any], log: Path,
                 start_timeout: float = 60, env: dict[str, str] | None = None) -> None:
        """``env``: the child's environment (default: ours)."""
        from meshd.dev.processes import pdeathsig_prefix

        self.kind = kind
        self.log = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*pdeathsig_prefix(), sys.executable, str(Path(script).resolve()),
             f"--{kind}-child", json.dumps(spec)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1, cwd=ROOT,
            env={**(os.environ if env is None else env), "PYTHONPATH": str(ROOT)})
        self.info = self.read(start_timeout)
        self.addr = str(self.info.get("addr", ""))
        self.pid = int(self.info["pid"])

    def read(self, timeout: float) -> dict[str, Any]:
        return read_line(self.proc, timeout, f"{self.kind} child", self.log.name)

    def cmd(self, line: str, timeout: float = 30) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.read(timeout)

    def stop(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        with contextlib.suppress(Exception):
            out = self.cmd("stop", 10)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()
        return out
