"""Another build of meshd to run beside this one: a mesh in the middle of a rolling upgrade.

A build is a commit of this repository, extracted whole (its generated gRPC code is committed)
into a folder that a node of :mod:`testbed.cluster` runs from (``Node.root``).  Its Python
dependencies must be the ones this checkout's virtualenv holds, as they are between
neighbouring releases; a commit whose dependencies changed needs a second virtualenv.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

from testbed.cluster import ROOT

PREVIOUS = "c90bba3e2b5ae4cee1cc9573bd2911dbaab9f008"
"""The build the upgrade tests run beside this one: the last commit before this checkout's
wire-format changes that passed CI from a clean clone (there are no release tags yet)."""


def commit_of(ref: str) -> str | None:
    """The full hash ``ref`` names in this repository, or None (a shallow clone lacks it)."""
    got = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet",
                          f"{ref}^{{commit}}"], capture_output=True, text=True)
    commit = got.stdout.strip()
    return commit if got.returncode == 0 and commit else None


def extract(ref: str, into: Path) -> Path:
    """The tree of ``ref`` written under ``into`` (once); returns its folder."""
    commit = commit_of(ref)
    if commit is None:
        raise LookupError(f"{ref} is not in this clone (a shallow one?)")
    dest = into / commit[:12]
    if (dest / "meshd" / "cli.py").exists():
        return dest
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit],
                             capture_output=True, check=True).stdout
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest
