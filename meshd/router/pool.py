"""The router worker processes an agent keeps running (``--router-workers N``, default 1): N
of :mod:`meshd.router.worker`, which serve the router's ports (the agent serves none), each
restarted when it dies.

Restarts back off (1 s, doubling to 30 s, reset after a worker has run for a minute), so a
worker that cannot start (a port taken by something else, a broken token file) does not
spin.  On shutdown each is asked to stop (SIGTERM: it stops taking connections and lets
in-flight requests finish) and killed if it has not after the grace.  A signal sent to the
agent's whole process group (Ctrl-C, systemd, ``timeout``) reaches the workers at the same
moment; :meth:`WorkerPool.closing` keeps those exits from being taken for crashes.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

log = logging.getLogger("meshd.router")

SHM_DIR = "router-shm"
"""The folder of the data directory holding the router's shared memory registrations
(workers and an in-agent router alike; emptied when the agent starts)."""
BACKOFF = (1.0, 30.0)
"""Seconds before restarting a worker that died: first, and at most."""
STEADY = 60.0
"""A worker that ran this long before dying restarts after the first backoff again."""


class WorkerPool:
    def __init__(self, count: int, argv: Sequence[str]) -> None:
        """``count`` worker processes, each ``python -m meshd.router.worker *argv``."""
        self.count = count
        self.argv = [sys.executable, "-m", "meshd.router.worker", *argv]
        self.procs: list[asyncio.subprocess.Process | None] = [None] * count
        self.restarts = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    async def start(self) -> None:
        for i in range(self.count):
            self._tasks.append(asyncio.create_task(self._keep(i)))

    async def _keep(self, i: int) -> None:
        loop = asyncio.get_running_loop()
        delay = BACKOFF[0]
        while not self._stopping:
            started = loop.time()
            proc = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.DEVNULL)
            self.procs[i] = proc
            code = await proc.wait()
            if self._stopping:
                return
            ran = loop.time() - started
            if ran >= STEADY:
                delay = BACKOFF[0]
            self.restarts += 1
            log.warning("router worker exited; restarting", extra={
                "event": "router_worker_exited", "worker": i, "pid": proc.pid,
                "returncode": code, "ran_seconds": round(ran, 1),
                "restart_in": delay})
            await asyncio.sleep(delay)
            delay = min(BACKOFF[1], delay * 2)

    def closing(self) -> None:
        """No more restarts: the agent is shutting down."""
        self._stopping = True

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None and p.returncode is None]

    async def stop(self, grace: float) -> None:
        self._stopping = True
        live = [p for p in self.procs if p is not None and p.returncode is None]
        for p in live:
            p.terminate()
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in live)), grace + 2.0)
        except TimeoutError:
            for p in live:
                if p.returncode is None:
                    p.kill()
            await asyncio.gather(*(p.wait() for p in live))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
