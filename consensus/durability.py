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

A power cut can still tear the record being written (one not yet acknowledged), and the kernel
writes the journal's pages back in any order: the header's end offset can point past a record
whose bytes are missing, zero or stale.  pysyncobj trusts that offset, and then fails to start
(``struct.error``; ``ValueError`` for an empty file), or loads the torn record as an entry:
applied once the commit index covers it, a command that does not decode wedges the tick thread;
a random term in it becomes the node's term, with which it wins the next election and
overwrites committed entries on the others.  :func:`repair_journal`, run before pysyncobj opens
the journal, ends the log at the last intact record instead; the member re-fetches the rest from
the leader.  ``tests/test_journal_cut.py`` tears a journal at every byte of its last record.
"""

from __future__ import annotations

import gzip
import logging
import os
import pickle
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pysyncobj import journal as pysyncobj_journal
from pysyncobj.pickle import loads as pysyncobj_loads

log = logging.getLogger("consensus.durability")


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


# pysyncobj's journal layout (pysyncobj/journal.py, format 1): a header of name (24 bytes),
# version (8), format (4) and the offset just past the last record (4), then records
# ``size(4) | idx(8) | term(8) | command | size(4)`` where ``size`` counts idx, term and command.
_HEADER = pysyncobj_journal.FIRST_RECORD_OFFSET
_END_AT = pysyncobj_journal.LAST_RECORD_OFFSET_OFFSET
_NAME = pysyncobj_journal.APP_NAME.ljust(pysyncobj_journal.NAME_SIZE, b"\0")
_NO_OP = 1  # pysyncobj.syncobj._COMMAND_TYPE: REGULAR 0, NO_OP 1, MEMBERSHIP 2, VERSION 3
_COMMAND_TYPES = 4


class JournalError(Exception):
    """The journal file is not a pysyncobj journal (its header is neither pysyncobj's nor the
    zeros of an unfinished one): the member refuses to start rather than parse it as records."""


@dataclass(frozen=True)
class JournalCheck:
    """What :func:`repair_journal` found: the intact records kept, and how many bytes the
    header claimed beyond them (dropped) and why."""

    entries: int
    dropped: int = 0
    reason: str = ""


def repair_journal(path: Path) -> JournalCheck:
    """End pysyncobj's journal at its last intact record, before pysyncobj opens it.

    Why: after a power cut the header's end offset may point past a torn record (see the module
    docstring), and pysyncobj trusts it.  A record is intact when it lies inside the file and
    below that offset, its leading and trailing sizes agree (pysyncobj walks the trailing one
    backwards when the leader truncates the log), its index follows the previous record's, its
    term does not go back, and its command decodes as pysyncobj will decode it.  The first record
    that is not ends the log there: the header is rewritten and ``fsync``ed, and the member
    re-fetches the rest from the leader like any follower that is behind.  Only a record this
    member never acknowledged can be torn (:class:`JournalSync` syncs before each
    acknowledgement), so dropping it loses nothing the group counted on; a record lost from the
    middle (a disk losing synced data) drops everything after it too, which is what Raft needs
    (a log is a prefix).

    A missing file is left to pysyncobj (it creates one); an empty or partly written header (the
    cut came right after pysyncobj created the file) is replaced by an empty journal; a header
    that is not pysyncobj's raises :class:`JournalError`, leaving the file for a human.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return JournalCheck(0)
    if len(data) < _HEADER or not any(data[:_HEADER]):
        head = data[:len(_NAME)]
        if any(head) and not _NAME.startswith(head):
            raise JournalError(f"{path}: not a pysyncobj journal (header {data[:_HEADER]!r})")
        _write_at(path, 0, _default_header(), truncate=len(data) < _HEADER)
        log.warning("%s: the journal's header was never written (power cut right after it was "
                    "created); starting from an empty log, re-fetched from the leader", path)
        return JournalCheck(0, 0, "unwritten header")
    if data[:len(_NAME)] != _NAME:
        raise JournalError(f"{path}: not a pysyncobj journal (header {data[:_HEADER]!r}); move "
                           "it away to let this member re-fetch its log from the others")
    end = struct.unpack_from("<I", data, _END_AT)[0]
    off, entries, reason = _intact_prefix(data, end)
    if off == end:
        return JournalCheck(entries)
    _write_at(path, _END_AT, struct.pack("<I", off))
    dropped = max(0, end - off)
    log.warning("%s: dropped %d byte(s) of the journal after its %d intact record(s) (%s): a "
                "write cut off by a crash; this member re-fetches them from the leader",
                path, dropped, entries, reason)
    return JournalCheck(entries, dropped, reason)


def _intact_prefix(data: bytes, end: int) -> tuple[int, int, str]:
    """(offset just past the last intact record, number of intact records, why the next one is
    not) for a journal whose header says its records end at ``end``."""
    if end < _HEADER:
        return _HEADER, 0, f"end offset {end} lies inside the header"
    limit = min(end, len(data))
    off, entries = _HEADER, 0
    prev: tuple[int, int] | None = None
    while off < end:
        if off + 4 > limit:
            return off, entries, f"record at byte {off} cut short"
        size = struct.unpack_from("<I", data, off)[0]
        if size <= 16 or off + 8 + size > limit:
            return off, entries, f"record at byte {off} has a bad size ({size})"
        if struct.unpack_from("<I", data, off + 4 + size)[0] != size:
            return off, entries, f"record at byte {off} is torn (its two sizes differ)"
        idx, term = struct.unpack_from("<QQ", data, off + 4)
        if idx < 1 or (prev is not None and (idx != prev[0] + 1 or term < prev[1])):
            return off, entries, (f"record at byte {off} has index {idx}, term {term} after "
                                  f"{prev or 'the start'}")
        if not _decodes(data[off + 20:off + 4 + size]):
            return off, entries, f"record {idx} (byte {off}) holds a command that does not decode"
        prev = (idx, term)
        off += size + 8
        entries += 1
    return off, entries, ""


def _decodes(command: bytes) -> bool:
    kind = command[0]
    if kind >= _COMMAND_TYPES:
        return False
    if kind == _NO_OP:
        return len(command) == 1
    try:
        pysyncobj_loads(command[1:])  # what pysyncobj does when it applies the entry
    except Exception:
        return False
    return True


def _default_header() -> bytes:
    version = pysyncobj_journal.APP_VERSION.ljust(pysyncobj_journal.VERSION_SIZE, b"\0")
    return _NAME + version + struct.pack("<II", pysyncobj_journal.JOURNAL_FORMAT_VERSION, _HEADER)


def _write_at(path: Path, offset: int, data: bytes, truncate: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        if truncate:
            os.ftruncate(fd, 0)
        os.pwrite(fd, data, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
