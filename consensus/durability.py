"""Make pysyncobj's journal durable before a node says anything that depends on it.

Why: pysyncobj writes its log through an ``mmap`` and flushes it once a second, and stores the
term and vote with a plain rename.  Raft's safety assumes the opposite: a follower must not
acknowledge entries, and nobody may grant a vote, before that state is on disk, or a power cut
of a minority can erase an entry the leader already counted as committed (and answered a client
for), or let a node vote twice in one term.

The fix needs no fork of pysyncobj: every message a node sends goes through our transport, so
:class:`JournalSync` runs just before each send (``RaftTls.before_send``) and in the state
machine before a result is handed to a waiting client.  It ``msync``s the journal when its tail
changed since the last sync and ``fsync``s the term/vote file (and its directory) when that file
was replaced.  In the common case (a heartbeat, nothing new) it costs one ``len`` and one
``stat``.

Log compaction writes a full dump and then truncates the journal; :func:`write_dump` (given to
pysyncobj as its ``serializer``) ``fsync``s the dump before pysyncobj renames it into place, and
the next sync ``fsync``s the directory (the rename) before it flushes the truncated journal.

What is guaranteed: an entry a follower acknowledged, and the leader's own copy of an entry it
committed, is on stable storage (as far as the OS's ``msync``/``fsync`` reach: a disk with a
volatile write cache that ignores flushes can still lose it).  What is not: ``raftCommitIndex``
is saved lazily, which is safe (it is re-learned from the leader); and the kernel may write the
truncated journal back on its own in the moment between pysyncobj's rename of a new dump and our
directory ``fsync`` — a power cut in that window of one node can cost that node its log, which
it then re-fetches from the others like a new member.
"""

from __future__ import annotations

import gzip
import os
import pickle
import threading
import time
from pathlib import Path
from typing import Any


class JournalSync:
    """Callable that flushes the journal of the ``SyncObj`` that ``owner()`` returns.

    ``owner`` is looked up lazily because the transport may send before ``SyncObj.__init__``
    has returned; until pysyncobj has built its journal there is nothing to flush.
    """

    def __init__(self, journal_file: Path, owner: Any) -> None:
        self.journal_file = journal_file
        self.meta_file = Path(f"{journal_file}.meta")
        self.dump_file: Path | None = None
        self._dump: tuple[int, int, int] | None = None
        self._owner = owner
        self._mark: tuple[int, int, int] | None = None
        self._meta: tuple[int, int, int] | None = None
        self._lock = threading.Lock()
        self.syncs = 0
        self.sync_seconds = 0.0

    def _journal(self) -> Any:
        obj = self._owner()
        return None if obj is None else getattr(obj, "_SyncObj__raftLog", None)

    def __call__(self) -> None:
        journal = self._journal()
        if journal is None:
            return
        with self._lock:
            if self.dump_file is not None:
                self._sync_dump(self.dump_file)
            n = len(journal)
            mark = (n, *journal[n - 1][1:3]) if n else (0, 0, 0)
            if mark != self._mark:
                start = time.perf_counter()
                journal.flush()
                self.sync_seconds += time.perf_counter() - start
                self.syncs += 1
                self._mark = mark
            self._sync_meta()

    def _sync_dump(self, dump: Path) -> None:
        key = _stat_key(dump)
        if key is not None and key != self._dump:
            fsync_dir(dump.parent)  # the rename of a dump write_dump already fsynced
            self._dump = key

    def _sync_meta(self) -> None:
        key = _stat_key(self.meta_file)
        if key is None or key == self._meta:
            return
        start = time.perf_counter()
        fd = os.open(self.meta_file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.meta_file.parent)
        self.sync_seconds += time.perf_counter() - start
        self.syncs += 1
        self._meta = key


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # Windows
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def write_dump(path: str, data: Any) -> None:
    """pysyncobj ``serializer``: its own format (gzip'd pickle), but ``fsync``ed before
    pysyncobj renames the file into place.  Runs on the tick thread (``useFork=False``)."""
    with open(path, "wb") as f:
        # Level 1: this runs on the tick thread, and level 9 stalls heartbeats for ~0.4 s
        # with 10,000 documents.
        with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=1) as g:
            pickle.dump(data, g, protocol=pickle.HIGHEST_PROTOCOL)
        f.flush()
        os.fsync(f.fileno())


def read_dump(path: str) -> Any:
    """pysyncobj ``deserializer`` for :func:`write_dump` files: our own dumps, or a snapshot a
    coordinator sent us, which only reaches the disk after the transport verified its node
    certificate (the Raft port's security boundary, see :mod:`consensus.transport`)."""
    with open(path, "rb") as f, gzip.GzipFile(fileobj=f) as g:
        return pickle.load(g)
