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


def main() -> int:
    hp = {**DEFAULTS, **json.loads(os.environ.get("MESHD_HPARAMS") or "{}")}
    directory = Path(os.environ.get("MESHD_CHECKPOINT_DIR") or ".")
    directory.mkdir(parents=True, exist_ok=True)
    steps, every = int(hp["steps"]), max(1, int(hp["checkpoint_every"]))
    x, y = _data(int(hp["features"]), int(hp["seed"]))
    rng = np.random.default_rng(int(hp["seed"]) + 1)
    found = latest_checkpoint(directory)
    start, w = found if found is not None else (0, np.zeros(x.shape[1]))
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stop.append(signum))
    if found is not None:
        _emit({"step": start, "loss": _loss(w, x, y), "progress": start / steps,
               "message": f"resumed from step {start}"})
    for step in range(start + 1, steps + 1):
        idx = rng.integers(0, len(x), size=int(hp["batch"]))
        xb, yb = x[idx], y[idx]
        p = 1.0 / (1.0 + np.exp(-(xb @ w)))
        w = w - float(hp["lr"]) * xb.T @ (p - yb) / len(idx)
        if hp["step_seconds"]:
            time.sleep(float(hp["step_seconds"]))
        report: dict[str, Any] = {"step": step, "loss": _loss(w, x, y),
                                  "progress": step / steps}
        if step % every == 0 or step == steps or stop:
            report["checkpoint"] = str(_save(directory, step, w))
        _emit(report)
        if stop and step < steps:
            _emit({"message": f"stopped at step {step} (SIGTERM); checkpoint saved"})
            return 128 + signal.SIGTERM
    return 0


def _emit(report: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
