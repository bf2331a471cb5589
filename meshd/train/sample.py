"""A small real training job: logistic regression fitted with NumPy on generated data.

Why it ships: the whole scheduler path (placement, lease, child process, progress, checkpoint,
failover and resume) has to run on CPU-only machines, in tests and from the README.  It is a
real fit - the loss it reports falls - and it checkpoints like a real job: atomically, every
``checkpoint_every`` steps, and on start it resumes from the newest checkpoint it finds.

Run as ``python -m meshd.train.sample``; the trainer passes, as a job's environment:

* ``MESHD_CHECKPOINT_DIR`` - the job's ``checkpoints`` location (a directory);
* ``MESHD_HPARAMS`` - JSON: ``steps`` (200), ``lr`` (0.5), ``batch`` (256), ``features`` (16),
  ``seed`` (0), ``checkpoint_every`` (20), ``step_seconds`` (0: extra sleep per step, so a
  test can make a job last long enough to be killed mid-way).

It prints one JSON object per line on stdout, which the trainer turns into lease renewals:
``{"step", "loss", "progress", "checkpoint"}``.  On SIGTERM (the trainer hands the job back:
cancel, or a drain with ``on_drain: migrate``) it checkpoints the step it is at and exits
with 143, so the next attempt loses nothing.

**Over several nodes** (``gpus.nodes`` > 1) it is data-parallel: every rank draws its own
batches, the ranks sum their gradients with a ring all-reduce
(:mod:`meshd.train.sample_ring`, over ``MESHD_RING_ADDRS``) and apply the mean.  Rank 0
resumes from and writes the checkpoints (the start step and weights reach the other ranks
through the ring), a SIGTERM on any rank stops every rank at the same step (the others exit
with 75, so the stopped rank's outcome is the gang's), and each rank
prints the all-reduce's time every ``checkpoint_every`` steps as ``{"comm": {...}}``.  A
rank whose peer vanished exits with 75 (``EXIT_RETRY``): the job moves, it does not fail.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from meshd.train.sample_ring import PeerLost, Ring

DEFAULTS: dict[str, Any] = {"steps": 200, "lr": 0.5, "batch": 256, "features": 16, "seed": 0,
                            "checkpoint_every": 20, "step_seconds": 0.0}


def _data(features: int, seed: int, n: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    true_w = rng.normal(size=features)
    x = rng.normal(size=(n, features))
    y = (x @ true_w + 0.5 * rng.normal(size=n) > 0).astype(np.float64)
    return x, y


def _loss(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    z = x @ w
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


def latest_checkpoint(directory: Path) -> tuple[int, np.ndarray] | None:
    """The newest complete checkpoint in ``directory``: (step, weights)."""
    best: tuple[int, Path] | None = None
    for path in directory.glob("step-*.npz"):
        try:
            step = int(path.stem.removeprefix("step-"))
        except ValueError:
            continue
        if best is None or step > best[0]:
            best = (step, path)
    if best is None:
        return None
    with np.load(best[1]) as data:
        return best[0], np.array(data["w"])


def _save(directory: Path, step: int, w: np.ndarray) -> Path:
    path = directory / f"step-{step:08d}.npz"
    tmp = directory / f".step-{step:08d}.tmp.npz"
    np.savez(tmp, w=w)
    os.replace(tmp, path)  # a reader never sees half a checkpoint
    return path


EXIT_RETRY = 75
"""Exit code asking the trainer to run the job again (meshd.train.run.EXIT_RETRY; not
imported from there: this child process stays light)."""


def main() -> int:
    hp = {**DEFAULTS, **json.loads(os.environ.get("MESHD_HPARAMS") or "{}")}
    directory = Path(os.environ.get("MESHD_CHECKPOINT_DIR") or ".")
    directory.mkdir(parents=True, exist_ok=True)
    rank, nodes = int(os.environ.get("MESHD_RANK", "0")), int(os.environ.get("MESHD_NNODES", "1"))
    ring: Ring | None = None
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stop.append(signum))
    try:
        if nodes > 1:
            ring = Ring(rank, os.environ["MESHD_RING_ADDRS"].split(","),
                        int(os.environ["MESHD_COMM_PORT"]),
                        int(os.environ.get("MESHD_LEASE_TOKEN", "0")))
        return _fit(hp, directory, rank, ring, stop)
    except PeerLost as exc:
        _emit({"message": f"rank {rank}: {exc}; handing the job back"})
        return EXIT_RETRY
    finally:
        if ring is not None:
            ring.close()


def _fit(hp: dict[str, Any], directory: Path, rank: int, ring: Ring | None,
         stop: list[int]) -> int:
    steps, every = int(hp["steps"]), max(1, int(hp["checkpoint_every"]))
    x, y = _data(int(hp["features"]), int(hp["seed"]))
    rng = np.random.default_rng(int(hp["seed"]) + 1 + rank)
    found = latest_checkpoint(directory) if rank == 0 else None
    start, w = found if found is not None else (0, np.zeros(x.shape[1]))
    if ring is not None:  # every rank starts from rank 0's checkpoint
        got = ring.all_reduce(np.concatenate(([start], w)) if rank == 0
                              else np.zeros(len(w) + 1))
        start, w = int(got[0]), got[1:]
    if start:
        _emit({"step": start, "loss": _loss(w, x, y), "progress": start / steps,
               "message": f"resumed from step {start}"})
    took: list[float] = []
    for step in range(start + 1, steps + 1):
        idx = rng.integers(0, len(x), size=int(hp["batch"]))
        xb, yb = x[idx], y[idx]
        p = 1.0 / (1.0 + np.exp(-(xb @ w)))
        grad = xb.T @ (p - yb) / len(idx)
        halt = bool(stop)
        if ring is not None:
            t0 = time.perf_counter()
            total = ring.all_reduce(np.concatenate((grad, [float(halt)])))
            took.append(time.perf_counter() - t0)
            grad, halt = total[:-1] / ring.n, total[-1] > 0
        w = w - float(hp["lr"]) * grad
        if hp["step_seconds"]:
            time.sleep(float(hp["step_seconds"]))
        report: dict[str, Any] = {"step": step, "loss": _loss(w, x, y),
                                  "progress": step / steps}
        if rank == 0 and (step % every == 0 or step == steps or halt):
            report["checkpoint"] = str(_save(directory, step, w))
        if ring is not None and took and (step % every == 0 or step == steps):
            report["comm"] = {"op": "all_reduce", "seconds": float(np.median(took)),
                              "bytes": int(grad.nbytes + 8), "algorithm": "ring",
                              "world_size": ring.n}
            took.clear()
        _emit(report)
        if halt and step < steps:
            if not stop:  # another rank was stopped: this one is not at fault
                _emit({"message": f"stopped at step {step}: another rank was stopped"})
                return EXIT_RETRY
            _emit({"message": f"stopped at step {step} (SIGTERM); checkpoint saved"})
            return 128 + signal.SIGTERM
    return 0


def _emit(report: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
