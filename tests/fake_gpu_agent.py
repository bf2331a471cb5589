"""Test-only: ``python -m tests.fake_gpu_agent ARGS`` runs ``meshd.cli`` with ARGS, its NVML
answered by :class:`tests.fake_nvml.FakeNvml` with ``MESHD_TEST_GPUS`` GPUs (default 2), each
with ``MESHD_TEST_GPU_TOTAL_MB`` MiB of memory of which ``MESHD_TEST_GPU_FREE_MB`` are free
(unset: :class:`tests.fake_nvml.FakeGpu`'s defaults, 80 GiB and 60 GiB).

Everything else is the real agent; the GPU adapter imports ``pynvml`` by name, so the fake is
put in ``sys.modules`` before the agent starts.  Used where a multi-process test needs GPU
series on a machine without a GPU (tests/test_prometheus.py)."""

from __future__ import annotations

import os
import sys

from tests.fake_nvml import FakeGpu, FakeNvml


def main() -> int:
    count = int(os.environ.get("MESHD_TEST_GPUS", "2"))
    args = sys.argv[1:]
    node = args[args.index("--node") + 1] if "--node" in args else "node"
    total, free = (os.environ.get(var) for var in ("MESHD_TEST_GPU_TOTAL_MB",
                                                    "MESHD_TEST_GPU_FREE_MB"))
    gpus = [FakeGpu(uuid=f"GPU-{node}-{i:04d}", temperature=50 + i, gpu_util=30 + 10 * i,
                    memory_total=int(total) << 20 if total else FakeGpu.memory_total,
                    memory_free=int(free) << 20 if free else FakeGpu.memory_free)
            for i in range(count)]
    sys.modules["pynvml"] = FakeNvml(gpus)
    from meshd.cli import main as agent  # noqa: PLC0415 - after the fake is in place

    return agent(args)


if __name__ == "__main__":
    sys.exit(main())
