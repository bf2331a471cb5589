"""What meshd reads off a real NVIDIA GPU, checked on a machine that has one.

    python3 bench/gpu_check.py [--alloc-gib 4] [--out DIR]

CI machines have no GPU, so the GPU adapter's tests run there against a fake NVML; this
script is the check on real hardware.  It runs with the packages a GPU machine's image
already has (``nvidia-ml-py``, ``msgpack``, and ``torch`` for the footprint) and meshd's own
modules, nothing else:

1. **Readings**: ``adapters.gpu.NvmlReader`` opens the real NVML and reads every GPU; each
   field is printed, with the NVML calls that failed (``reader.failures``), and checked
   for sense (total memory > 0, free <= total, temperature in 0..120 C, power > 0).
2. **The adapter's loop**: ``GpuAdapter`` polls a few times; it must not fall back to
   CPU-only, and must count no errors.
3. **The wire**: the readings survive ``meshd.signals.wire.encode``/``decode`` (what gossip
   carries).
4. **Quarantine**: ``HealthMonitor`` with the default ``HealthPolicy`` finds no problem on
   a healthy GPU; with the ECC counter it reads taken as the acknowledged base and a rule of
   one error, it would quarantine only on a new error (checked by adding one).
5. **A footprint, as model placement measures it**: NVML's used memory before and after
   ``torch`` allocates ``--alloc-gib`` GiB on the GPU, and after it frees it (the CUDA
   context's own cost shows as the remainder).

Prints one JSON document (also written to ``--out``/gpu_check.json) and exits 1 if a check
failed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters.gpu import GpuAdapter, NvmlReader  # noqa: E402
from adapters.model import GpuState  # noqa: E402
from meshd.control.health import HealthMonitor, HealthRules  # noqa: E402
from meshd.signals.wire import NodeSignals, decode, encode  # noqa: E402

GiB = 1 << 30


def readings(checks: list[str]) -> list[GpuState]:
    reader = NvmlReader()
    reason = reader.open()
    if reason is not None:
        checks.append(f"FAIL NVML did not open: {reason}")
        return []
    try:
        gpus = reader.read(now=time.monotonic())
    finally:
        reader.close()
    failures = {str(k): v for k, v in reader.failures.items()}
    print(json.dumps({"nvml_failures": failures}), flush=True)
    if not gpus:
        checks.append("FAIL NVML opened but no GPU was read")
    for g in gpus:
        print(json.dumps({"gpu": dataclasses.asdict(g)}, default=str), flush=True)
        sane = [g.memory_total > 0, 0 <= g.memory_free <= g.memory_total, bool(g.uuid)]
        if g.temperature_c is not None:
            sane.append(0 <= g.temperature_c <= 120)
        if g.power_w is not None:
            sane.append(g.power_w > 0)
        checks.append(("ok" if all(sane) else "FAIL") + f" GPU {g.index} readings are sane")
    return gpus


async def adapter_loop(checks: list[str]) -> dict[str, Any]:
    adapter = GpuAdapter(interval=0.2)
    await adapter.start()
    try:
        await asyncio.sleep(1.1)
    finally:
        await adapter.close()
    out = {"cpu_only": adapter.cpu_only, "reason": adapter.reason, "polls": adapter.polls,
           "errors": dict(adapter.errors), "gpus": len(adapter.gpus)}
    good = not adapter.cpu_only and adapter.polls >= 3 and not adapter.errors and adapter.gpus
    checks.append(("ok" if good else "FAIL") + f" GpuAdapter polled {adapter.polls} times, "
                  f"errors {dict(adapter.errors)}")
    return out


def wire(gpus: list[GpuState], checks: list[str]) -> None:
    now = time.monotonic()
    back = decode(encode(NodeSignals(epoch=1, seq=1, gpus=gpus), now), now)
    same = [(a.uuid, a.memory_total, a.memory_free, a.ecc_uncorrected, a.throttle)
            == (b.uuid, b.memory_total, b.memory_free, b.ecc_uncorrected, b.throttle)
            for a, b in zip(gpus, back.gpus, strict=True)]
    checks.append(("ok" if all(same) and len(back.gpus) == len(gpus) else "FAIL")
                  + " readings survive the gossip encoding")


def quarantine(gpus: list[GpuState], checks: list[str]) -> None:
    rules = HealthRules()
    base = {g.uuid: g.ecc_uncorrected or 0 for g in gpus}
    monitor = HealthMonitor(ecc_acknowledged=base)
    sig = NodeSignals(gpus=gpus)
    now = time.monotonic()
    healthy = monitor.problems(now, sig, rules)
    checks.append(("ok" if not healthy else "FAIL")
                  + f" healthy GPUs raise no problem (found {[p.text for p in healthy]})")
    ecc_known = [g for g in gpus if g.ecc_uncorrected is not None]
    if not ecc_known:
        checks.append("skip ECC quarantine: NVML gives no uncorrected ECC count here")
        return
    bumped = [dataclasses.replace(g, ecc_uncorrected=(g.ecc_uncorrected or 0) + 1)
              if g in ecc_known[:1] else g for g in gpus]
    found = monitor.problems(now + 1, NodeSignals(gpus=bumped), rules)
    checks.append(("ok" if [p.cause for p in found] == ["ecc"] else "FAIL")
                  + f" one new uncorrected ECC error quarantines: {[p.text for p in found]}")


def footprint(alloc_gib: float, checks: list[str]) -> dict[str, Any]:
    try:
        import torch
    except ImportError as exc:
        checks.append(f"skip footprint: {exc}")
        return {}
    if not torch.cuda.is_available():
        checks.append("skip footprint: torch sees no CUDA device")
        return {}

    def used() -> int:
        reader = NvmlReader()
        assert reader.open() is None
        try:
            g = reader.read(now=time.monotonic())[0]
        finally:
            reader.close()
        return g.memory_total - g.memory_free

    before = used()
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    context = used()
    t0 = time.perf_counter()
    block = torch.empty(int(alloc_gib * GiB), dtype=torch.uint8, device="cuda")
    block.fill_(1)
    torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    loaded = used()
    del block
    torch.cuda.empty_cache()
    freed = used()
    out = {"before_mib": before / 2**20, "cuda_context_mib": (context - before) / 2**20,
           "allocated_gib": alloc_gib, "measured_gib": (loaded - context) / GiB,
           "after_free_mib": (freed - before) / 2**20, "alloc_s": load_s}
    close = abs((loaded - context) / GiB - alloc_gib) <= 0.05 * alloc_gib + 0.01
    checks.append(("ok" if close else "FAIL") + f" NVML before/after measures the "
                  f"{alloc_gib:g} GiB allocation as {out['measured_gib']:.3f} GiB")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--alloc-gib", type=float, default=4.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    checks: list[str] = []
    gpus = readings(checks)
    report: dict[str, Any] = {"gpus": [dataclasses.asdict(g) for g in gpus]}
    report["adapter"] = asyncio.run(adapter_loop(checks))
    if gpus:
        wire(gpus, checks)
        quarantine(gpus, checks)
        report["footprint"] = footprint(args.alloc_gib, checks)
    report["checks"] = checks
    text = json.dumps(report, indent=1, default=str)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.json").write_text(text + "\n")
    return 1 if any(c.startswith("FAIL") for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
