"""RFC 7386 JSON merge-patch, used by the store's ``patch`` command.

A patch names only what changes: ``{"cordoned": true}`` leaves ``draining`` alone, so a cordon
and a drain issued concurrently both survive (a read-modify-write put would lose one of them).
``null`` removes a key, which after validation means "back to the default".
"""

from __future__ import annotations

from typing import Any

from policy.errors import PolicyError
from policy.fields import join

MAX_DEPTH = 16
"""Deeper patches are rejected: no policy spec nests anywhere near this."""


def merge_patch(target: Any, patch: Any, path: str = "spec", depth: int = 0) -> Any:
    """Apply ``patch`` to ``target`` per RFC 7386 without modifying either.

    Raises :class:`PolicyError` (naming the path) for patches nested beyond :data:`MAX_DEPTH`.
    """
    if not isinstance(patch, dict):
        return patch  # a non-object patch replaces the target outright
    if depth >= MAX_DEPTH:
        raise PolicyError(path, f"nested more than {MAX_DEPTH} levels deep")
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value, join(path, key), depth + 1)
    return result
