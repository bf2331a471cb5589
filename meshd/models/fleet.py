"""What the placement controller sees of the fleet: nodes, their GPUs, and the models to place.

Plain frozen values the shell builds each tick from the fused view (NVML's free memory, the
node flags in the policy group, gossip's liveness), the ModelPin documents and the scorer's
demand; the planner (:mod:`meshd.models.plan`) reads nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

MIB = 1 << 20
GIB = 1 << 30

FootprintSource = Literal["measured", "declared", "unknown"]


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU of a node, as NVML last read it."""

    id: str
    """UUID or index, as the Triton adapter names it when it loads a model there."""
    type: str
    """NVML's product name (``NVIDIA A100-SXM4-80GB``), matched exactly by a pin's
    ``gpu_types``, as the router's pin check does."""
    free_bytes: int
    total_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Node:
    """A Triton server's node: where it is, whether it may take new replicas, what it has."""

    name: str
    zone: str = ""
    alive: bool = True
    """False once gossip declares it failed: its replicas count as gone."""
    cordoned: bool = False
    draining: bool = False
    quarantined: bool = False
    gpus: tuple[Gpu, ...] = ()
    cpu_slots: int = 0
    """CPU-only replicas the node declares room for (NVML has no memory to measure there)."""
    loaded: frozenset[str] = frozenset()
    """Model keys its Triton reports loaded or loading, placed by meshd or not."""

    @property
    def schedulable(self) -> bool:
        """Whether new replicas may go here: alive and no operator or health flag set."""
        return self.alive and not (self.cordoned or self.draining or self.quarantined)


@dataclass(frozen=True, slots=True)
class Pin:
    """A ModelPin's placement fields (defaults: no constraint, no floor, no cap)."""

    min_replicas: int = 0
    max_replicas: int | None = None
    nodes: frozenset[str] = frozenset()
    zones: frozenset[str] = frozenset()
    gpu_types: frozenset[str] = frozenset()
    min_free_vram_mb: int = 0

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Pin:
        """From a validated ModelPin document's spec (``policy.model``)."""
        return cls(min_replicas=int(spec.get("min_replicas") or 0),
                   max_replicas=spec.get("max_replicas"),
                   nodes=frozenset(spec.get("nodes") or ()),
                   zones=frozenset(spec.get("zones") or ()),
                   gpu_types=frozenset(spec.get("gpu_types") or ()),
                   min_free_vram_mb=int(spec.get("min_free_vram_mb") or 0))

    def allows(self, node: Node) -> bool:
        """Whether the pin's ``nodes`` and ``zones`` admit the node (GPU types aside)."""
        return ((not self.nodes or node.name in self.nodes)
                and (not self.zones or node.zone in self.zones))


@dataclass(frozen=True, slots=True)
class Model:
    """A model to place: its pin, its footprint, and how much work it has."""

    name: str
    revision: str = ""
    pin: Pin = Pin()
    footprint_bytes: int | None = None
    """GPU memory one replica takes; None = unknown (never loaded, nothing declared)."""
    footprint_source: FootprintSource = "unknown"
    """``measured``: NVML's used memory before and after a load; ``declared``: an operator's
    figure; ``unknown``: placed where ``min_free_vram_mb`` is met, or on a CPU slot."""
    demand: float = 0.0
    """Predicted seconds of work per second over the fleet (the scorer's signal): the number
    of replicas that would be busy all the time."""
    requested_at: float | None = None
    """When a request last arrived while no replica was loaded (scale from zero)."""

    @property
    def key(self) -> str:
        """``name`` or ``name:revision``: how ModelPin documents and the record name it."""
        return f"{self.name}:{self.revision}" if self.revision else self.name


def fmt_bytes(n: int | float) -> str:
    """``22.5 GiB``, ``512 MiB``: memory in the units operators read NVML in."""
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    return f"{n / MIB:.0f} MiB"
