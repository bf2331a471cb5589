"""Every node's read copy of a Raft group: the committed state, cached on disk.

Why a copy on every node: routers and schedulers read policies on their hot paths, and policies
must stay in force when the coordinators are unreachable.  The copy follows the committed log
(a coordinator feeds it from its own state machine; other nodes from a coordinator's
``Follow`` stream), is saved to disk so a restarted node enforces the last policies it knew
before it can reach anyone, and wakes waiters (event streams) when it moves.

Lives in the asyncio loop; nothing here blocks except the (debounced) disk write.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
from collections.abc import Callable, Collection
from pathlib import Path

from policy.errors import PolicyError
from policy.store import Change, GapError, PolicyStore

log = logging.getLogger("consensus.view")

SAVE_DELAY = 0.5
"""Seconds to gather changes before the copy is written to disk again."""


class GroupView:
    """The read copy of group ``name``; ``path`` (optional) is its disk cache."""

    def __init__(self, name: str, kinds: Collection[str], path: Path | None = None) -> None:
        self.name = name
        self.kinds = frozenset(kinds)
        self.path = path
        self.store = PolicyStore(self.kinds)
        self.source = "empty"  # empty | disk | <who feeds it>
        self._moved = asyncio.Condition()
        self._save_task: asyncio.Task[None] | None = None
        self.resets = 0
        self.listeners: list[Callable[[], None]] = []
        """Called (in the loop) whenever the copy moves."""

    @property
    def version(self) -> int:
        return self.store.version

    def load(self) -> bool:
        """Take the copy saved on disk, if any (at start, before anything feeds us)."""
        if self.path is None or not self.path.exists():
            return False
        try:
            data = json.loads(self.path.read_text())
            self.store = PolicyStore.restore(data)
        except (OSError, ValueError, PolicyError) as exc:
            log.warning("ignoring unreadable policy cache", extra={
                "event": "view_cache_bad", "group": self.name, "path": str(self.path),
                "detail": str(exc)})
            return False
        self.source = "disk"
        return True

    def apply(self, change: Change) -> bool:
        """Take one committed change; False (and nothing changed) when it leaves a gap, in which
        case the feeder must send a snapshot."""
        try:
            self.store.follow(change)
        except GapError:
            return False
        self._moved_now()
        return True

    def reset(self, snapshot: dict) -> None:
        """Replace the copy wholesale (a snapshot from the log or the feeder)."""
        self.store = PolicyStore.restore(snapshot)
        self.resets += 1
        self._moved_now()

    async def wait_beyond(self, version: int, timeout: float | None = None) -> bool:
        """Wait until the copy moves past ``version`` (or is reset); False on timeout."""
        async with self._moved:
            try:
                await asyncio.wait_for(self._moved.wait_for(lambda: self.version != version),
                                       timeout)
            except TimeoutError:
                return False
        return True

    def _moved_now(self) -> None:
        async def notify() -> None:
            async with self._moved:
                self._moved.notify_all()
        loop = asyncio.get_running_loop()
        loop.create_task(notify())
        for listener in self.listeners:
            listener()
        if self.path is not None and (self._save_task is None or self._save_task.done()):
            self._save_task = loop.create_task(self._save_later())

    async def _save_later(self) -> None:
        await asyncio.sleep(SAVE_DELAY)
        # Snapshot here (consistent with the loop's state); encode and write off the loop,
        # which is what costs (tens of ms with a long history).
        await asyncio.to_thread(self._write, self.store.snapshot())

    def save(self) -> None:
        """Write the copy to disk now (at shutdown)."""
        self._write(self.store.snapshot())

    def _write(self, snapshot: dict) -> None:
        """Write ``snapshot`` to disk atomically (temp file + rename)."""
        if self.path is None:
            return
        data = json.dumps(snapshot, separators=(",", ":"))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(data)
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("cannot save the policy cache", extra={
                "event": "view_cache_save_failed", "group": self.name, "detail": str(exc)})
            Path(tmp).unlink(missing_ok=True)
