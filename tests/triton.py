"""Real Triton servers for tests: fixtures and small helpers around :mod:`meshd.dev.triton`.

Not a test module. The fixtures are re-exported by ``tests/conftest.py``, so any test can ask
for them by name:

- ``triton_server``: one server on ``tests/triton_models`` (``add_sub``, ``delay``), shared by
  the test module, handed to each test running and with every behaviour cleared (restarted if
  an earlier test killed it);
- ``triton_factory``: ``triton_factory(n, models=..., explicit=..., repo=...)`` starts ``n``
  servers at once and returns them; all are stopped when the test ends.

Both skip the test, with the reason, where Triton cannot run (no ``nvidia-pytriton`` wheel, not
Linux x86_64, no stub for this Python, ...).
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshd.dev.triton import (
    DEFAULT_REPO,
    TritonServer,
    start_all,
    stop_all,
    unavailable_reason,
)

MODEL_REPO = DEFAULT_REPO
"""``tests/triton_models``."""


def require_triton() -> None:
    """Skip the calling test (with the reason) when Triton cannot run here."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"Triton unavailable: {reason}")


class TritonFactory:
    """Starts real Triton servers for one test and stops them all at its end."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.servers: list[TritonServer] = []

    def __call__(self, count: int = 1, *, repo: Path = MODEL_REPO,
                 models: list[str] | None = None, explicit: bool = False,
                 start: bool = True, timeout: float = 90) -> list[TritonServer]:
        """``count`` new servers (started together unless ``start=False``)."""
        require_triton()
        made = []
        for _ in range(count):
            i = len(self.servers)
            server = TritonServer(repo, self.base_dir / f"triton{i}", models=models,
                                  explicit=explicit, name=f"triton{i}")
            self.servers.append(server)
            made.append(server)
        if start:
            start_all(made, timeout=timeout)
        return made

    def close(self) -> None:
        stop_all(self.servers)


@pytest.fixture(scope="module")
def _triton_module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    require_triton()
    server = TritonServer(MODEL_REPO, tmp_path_factory.mktemp("triton"), name="triton-shared")
    server.start(timeout=90)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def triton_server(_triton_module_server: TritonServer) -> Iterator[TritonServer]:
    """A running Triton server on ``tests/triton_models`` with normal behaviour (module-shared)."""
    server = _triton_module_server
    if not server.is_running():
        server.restart(timeout=90)
    server.clear_behaviour()
    yield server
    if server.behaviours:
        server.clear_behaviour(wait=False)


@pytest.fixture
def triton_factory(tmp_path: Path) -> Iterator[TritonFactory]:
    """``triton_factory(n, ...)`` -> ``n`` started servers, all stopped at teardown."""
    factory = TritonFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()


# --------------------------------------------------------------------------- helpers

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(metrics_url: str, timeout: float = 5) -> str:
    """The Prometheus text of ``metrics_url``."""
    with urllib.request.urlopen(metrics_url, timeout=timeout) as resp:
        body: bytes = resp.read()
    return body.decode()


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """Sum of the samples ``name`` whose labels include ``labels`` (None if there is none)."""
    total: float | None = None
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m.group(1) != name:
            continue
        have = dict(_LABEL.findall(m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total = (total or 0.0) + float(m.group(3))
    return total


def metric_lines(text: str, name: str) -> list[str]:
    """The sample lines of ``name`` (for reports and failure messages)."""
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def add_sub_inputs(a: Any, b: Any, module: Any) -> list[Any]:
    """``InferInput`` objects for ``add_sub`` from two FP32 arrays of shape [batch, n];
    ``module`` is ``tritonclient.grpc`` or ``tritonclient.grpc.aio``."""
    inputs = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        tensor = module.InferInput(name, list(value.shape), "FP32")
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def delay_inputs(nbytes: int, module: Any) -> list[Any]:
    """The ``PAYLOAD`` input for ``delay``: ``nbytes`` (a multiple of 4) bytes of FP32 zeros."""
    import numpy as np

    payload = np.zeros(nbytes // 4, dtype=np.float32)
    tensor = module.InferInput("PAYLOAD", list(payload.shape), "FP32")
    tensor.set_data_from_numpy(payload)
    return [tensor]
