"""Shared pytest fixtures.

``triton_server`` and ``triton_factory`` (real Triton servers from the nvidia-pytriton wheel)
live in :mod:`tests.triton`; ``meshes`` (started meshes with Raft coordinators) in
:mod:`tests.test_consensus_integration`.  Importing them here makes them available to every
test module.
"""

from tests.test_consensus_integration import meshes
from tests.triton import _triton_module_server, triton_factory, triton_server

__all__ = ["_triton_module_server", "meshes", "triton_factory", "triton_server"]
