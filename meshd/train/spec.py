"""A training job's spec: what ``SubmitJob`` and ``meshctl jobs submit`` accept.

Validated with the policy package's field checkers, so a bad spec is rejected the same way a
bad policy is: a :class:`policy.errors.PolicyError` naming the field (``gpus.count``,
``command[2]``), which the API turns into INVALID_ARGUMENT.

The job runs either a ``command`` (an argv list: a ``torchrun``/DeepSpeed line, a script) or
an ``entry`` point (``package.module:function``) in a child process of the trainer.  Its
size, for placement, is ``work_seconds`` when given, else ``data_bytes`` at
``BYTES_PER_SECOND`` (a deliberately rough prior; finished jobs are what refine it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from meshd.train.placement import Needs
from policy.errors import PolicyError
from policy.fields import (
    MAX_INT,
    Check,
    Choice,
    Field,
    Integer,
    ListOf,
    Number,
    Object,
    Pattern,
    Text,
    join,
    name_check,
    required,
    show,
)

BYTES_PER_SECOND = 50e6
"""Training throughput assumed for a job that gives only its data size (bytes per second
on one reference GPU)."""
DEFAULT_WORK_SECONDS = 600.0
"""Work assumed for a job that says nothing of its size."""
MAX_GPUS = 256
ENTRY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@dataclass(frozen=True)
class Scalars(Check):
    """A flat object of names to strings, numbers or booleans (hyperparameters, env)."""

    limit: int
    key_re: re.Pattern[str] | None = None

    @property
    def what(self) -> str:
        return f"an object of at most {self.limit} names to strings, numbers or booleans"

    def convert(self, value: object, path: str) -> dict[str, Any]:
        if not isinstance(value, dict) or len(value) > self.limit:
            raise self.fail(value, path)
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str) or not 0 < len(key) <= 128 or (
                    self.key_re is not None and not self.key_re.fullmatch(key)):
                raise PolicyError(path, f"bad name {show(key)}")
            where = join(path, key)
            if isinstance(item, str):
                if len(item) > 4096:
                    raise PolicyError(where, "must be at most 4096 characters")
            elif isinstance(item, float) and not math.isfinite(item):
                raise PolicyError(where, f"must be finite, got {show(item)}")
            elif not isinstance(item, bool | int | float) or (
                    isinstance(item, int) and abs(item) > MAX_INT):
                raise PolicyError(where, f"must be a string, number or boolean, got "
                                         f"{show(item)}")
            out[key] = item
        return out


MAX_NODES = 64


def _cross(spec: dict[str, Any], path: str) -> None:
    if bool(spec["command"]) == bool(spec["entry"]):
        raise PolicyError(join(path, "command"),
                          "give exactly one of command (an argv list) and entry "
                          "(module:function)")
    g = spec["gpus"]
    if g["nodes"] > 1 and g["count"] % g["nodes"]:
        raise PolicyError(join(join(path, "gpus"), "count"),
                          f"must be a multiple of gpus.nodes ({g['nodes']}): each node of a "
                          f"gang runs an equal share, got {g['count']}")


JOB_SPEC = Object({
    "id": required(name_check(), "the job's id, unique in the mesh (a resubmit with the "
                                 "same id and spec is the same job)"),
    "model": required(name_check(), "the model being trained or fine-tuned"),
    "command": Field(ListOf(Text(1, 4096), max_len=512, unique=False), [],
                     "argv of the job's process (e.g. torchrun ...)"),
    "entry": Field(Pattern(ENTRY_RE, "module:function", nullable=True), None,
                   "a Python entry point the trainer calls in a child process"),
    "env": Field(Scalars(128, ENV_RE), {}, "extra environment variables"),
    "hyperparameters": Field(Scalars(256), {}, "passed to the job as MESHD_HPARAMS (JSON)"),
    "data": Field(Text(0, 1024), "", "where the training data is (URI or path)"),
    "checkpoints": Field(Text(0, 1024), "", "where checkpoints go and resume from"),
    "gpus": Field(Object({
        "count": Field(Integer(ge=0, le=MAX_GPUS), 1, "GPUs (0 = a CPU job)"),
        "min_free_vram_mb": Field(Integer(ge=0), 0, "free memory each GPU must have (MiB)"),
        "type": Field(Text(0, 128), "", "GPU product name to match; empty = any"),
        "nodes": Field(Integer(ge=0, le=MAX_NODES), 0,
                       "nodes it spans, an equal share of count on each (a CPU job: one "
                       "slot each); 0 or 1 = one node"),
    }), {}, "what the job needs of its GPUs"),
    "zones": Field(ListOf(name_check()), [], "zones it may run in; empty = any"),
    "tenant": Field(name_check(), "default", "whose quota it counts against"),
    "priority": Field(Integer(ge=0, le=9), 5, "higher is placed first"),
    "work_seconds": Field(Number(gt=0, nullable=True), None,
                          "estimated seconds of work on one reference GPU"),
    "data_bytes": Field(Integer(ge=0), 0, "training data size, for the estimate"),
    "on_drain": Field(Choice(("finish", "migrate")), "finish",
                      "when its node drains: run to the end, or move from a checkpoint"),
}, cross=_cross)


@dataclass(frozen=True)
class JobSpec:
    """A validated job spec (every field present, defaults filled in)."""

    doc: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.doc["id"])

    def work_seconds(self) -> float:
        if self.doc["work_seconds"] is not None:
            return float(self.doc["work_seconds"])
        if self.doc["data_bytes"]:
            return self.doc["data_bytes"] / BYTES_PER_SECOND
        return DEFAULT_WORK_SECONDS

    @property
    def cpu_only(self) -> bool:
        """A job asking for 0 GPUs: it runs in a CPU slot (and only there)."""
        return bool(self.doc["gpus"]["count"] == 0)

    @property
    def slots(self) -> int:
        """GPUs (or, for a CPU job, slots: one per node) the job takes in all."""
        g = self.doc["gpus"]
        return int(g["count"] or max(1, g["nodes"]))

    def needs(self) -> Needs:
        g = self.doc["gpus"]
        return Needs(gpus=self.slots, work_s=self.work_seconds(),
                     min_free_vram_mb=g["min_free_vram_mb"], gpu_type=g["type"],
                     zones=tuple(self.doc["zones"]), nodes=g["nodes"])


def parse_job(raw: object) -> JobSpec:
    """Validate a job spec; raises :class:`PolicyError` naming the field."""
    return JobSpec(JOB_SPEC(raw, ""))
