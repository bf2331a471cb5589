"""The agent's shell around :class:`meshd.control.health.HealthMonitor`: once a second it reads the
node's own telemetry, its ``NodeFlags`` and the ``HealthPolicy`` in force, and writes what the
monitor decides as a ``NodeFlags`` patch through Raft.

Writes carry ``if_version`` (the flags' version the decision was made on), so a quarantine
an operator set or lifted in the meantime is never overwritten: the write is refused, and
the next look decides again on the new flags.  A write that fails (no quorum, no leader) is
retried after :data:`RETRY`.  ECC errors an operator has acknowledged are kept in
``<data-dir>/health.json`` so a restart does not quarantine the node again for them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from consensus.group import ConsensusError
from meshd.control.health import HealthMonitor, HealthRules, Quarantine
from meshd.control.plane import ControlPlane
from meshd.signals.wire import NodeSignals

log = logging.getLogger("meshd.health")

TICK = 1.0
RETRY = 5.0
WRITE_TIMEOUT = 5.0
DEFAULT_POLICY = "default"
"""The HealthPolicy name that applies to nodes without one of their own."""


def rules_for(control: ControlPlane, node: str) -> HealthRules:
    """The node's own HealthPolicy, else ``default``, else the built-in defaults."""
    store = control.views["policy"].store
    for name in (node, DEFAULT_POLICY):
        stored = store.get("HealthPolicy", name)
        if stored is not None:
            return HealthRules.from_spec(stored.document.spec)
    return HealthRules()


class AutoQuarantine:
    def __init__(self, node: str, control: ControlPlane, signals: Callable[[], NodeSignals],
                 data_dir: Path | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self.control = control
        self.signals = signals
        self.clock = clock
        self.path = data_dir / "health.json" if data_dir is not None else None
        self.monitor = HealthMonitor(self._load())
        self._saved = dict(self.monitor.ecc_acknowledged)
        self.actions: Counter[str] = Counter()
        """Writes made, by ``quarantine``/``lift``; failed ones under ``failed``."""

    async def run(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            try:
                await self.check()
            except Exception:  # noqa: BLE001 - one bad look must not end health checks
                log.exception("health check failed")

    async def check(self) -> None:
        """One look, and the write it calls for (a failed write sleeps out the retry delay)."""
        stored = self.control.views["policy"].store.get("NodeFlags", self.node)
        quarantined = stored.document.spec.get("quarantined") if stored else None
        rules = rules_for(self.control, self.node)
        action = self.monitor.step(self.clock(), self.signals(), rules, quarantined)
        self._save()
        if action is None:
            return
        if isinstance(action, Quarantine):
            spec: dict[str, Any] = {"quarantined": {"reason": action.reason, "auto": True}}
            kind = "quarantine"
        else:
            spec = {"quarantined": None}
            kind = "lift"
        command = {"op": "patch", "kind": "NodeFlags", "name": self.node, "spec": spec,
                   "if_version": stored.version if stored else 0,
                   "author": f"meshd/{self.node} (health)", "at": time.time()}
        try:
            result = await self.control.write("policy", command, WRITE_TIMEOUT)
        except ConsensusError as exc:
            result = {"ok": False, "error": exc.code, "message": str(exc)}
        if not result.get("ok"):
            self.actions["failed"] += 1
            log.warning("health: could not write the %s", kind, extra={
                "event": "auto_quarantine_failed", "action": kind,
                "detail": str(result.get("message") or result.get("error"))})
            await asyncio.sleep(RETRY)
            return
        self.actions[kind] += 1
        if isinstance(action, Quarantine):
            log.warning("node quarantined itself", extra={
                "event": "auto_quarantined", "reason": action.reason,
                "causes": sorted({p.cause for p in action.problems}),
                "strike": self.monitor.strikes + 1})
        else:
            log.warning("automatic quarantine lifted", extra={
                "event": "auto_quarantine_lifted", "reason": action.reason})

    def _load(self) -> dict[str, int]:
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text())
            acks = data.get("ecc_acknowledged", {}) if isinstance(data, dict) else {}
            return {str(k): int(v) for k, v in acks.items() if isinstance(v, int) and v >= 0}
        except (OSError, ValueError, AttributeError):
            return {}

    def _save(self) -> None:
        acks = self.monitor.ecc_acknowledged
        if self.path is None or acks == self._saved:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"ecc_acknowledged": acks}))
        os.replace(tmp, self.path)
        self._saved = dict(acks)
