"""Shared pytest fixtures.

``triton_server`` and ``triton_factory`` (real Triton servers from the nvidia-pytriton wheel)
live in :mod:`tests.triton`; importing them here makes them available to every test module.
"""

from tests.triton import _triton_module_server, triton_factory, triton_server

__all__ = ["_triton_module_server", "triton_factory", "triton_server"]
