"""The mesh's strongly consistent policies: kinds, validation, files and the replicated store.

Pure data and rules — no network, no clock, no imports from meshd/ or consensus/. consensus/
replicates :class:`PolicyStore` by feeding it Raft log entries; meshd/ and meshctl read and
write documents through it.
"""

from policy.document import dump_documents, parse_documents
from policy.errors import PolicyError
from policy.model import (
    GROUPS,
    KINDS,
    SPECS,
    Document,
    defaults,
    schedulable,
    validate,
    validate_key,
)
from policy.records import Change, StoredDoc
from policy.store import GapError, PolicyStore

__all__ = [
    "GROUPS", "KINDS", "SPECS", "Change", "Document", "GapError", "PolicyError", "PolicyStore",
    "StoredDoc", "defaults", "dump_documents", "parse_documents", "schedulable", "validate",
    "validate_key",
]
