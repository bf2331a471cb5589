"""The strategy interface, the registry of strategies, and plugin loading.

A strategy ranks a request's targets.  It is sans-I/O and sees only what the scorer hands it:
the eligible targets with this request's prediction filled in (``Target.p_*``) and a
:class:`Context`.  It returns the targets it would try, best first; the scorer keeps the first
``ctx.limit`` and does admission and hedging itself, so a strategy cannot break those.

Third-party strategies are Python entry points in the group ``meshd.strategies``: the entry
point's name is the strategy's name (what a ``RoutingPolicy`` names), its object a class or
factory called with no arguments that returns a :class:`Strategy`::

    [project.entry-points."meshd.strategies"]
    my_rank = "my_package.rank:MyRank"
"""

from __future__ import annotations

import importlib.metadata
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from meshd.score.config import RoutingConfig
from meshd.score.target import Target

log = logging.getLogger("meshd.score")

ENTRY_POINT_GROUP = "meshd.strategies"


@dataclass(slots=True)
class Context:
    """What a strategy may use besides the targets."""

    model: str
    units: int
    limit: int
    """How many targets the scorer will keep; ranking more is wasted work."""
    zone: str
    """This agent's zone."""
    routing: RoutingConfig
    rng: random.Random
    deadline: float
    """Value of the scorer's timer (``time.thread_time()`` by default) past which it will
    discard the answer: a strategy that loops may check it and return what it has."""


@runtime_checkable
class Strategy(Protocol):
    name: str

    def rank(self, targets: Sequence[Target], ctx: Context) -> Sequence[Target]:
        """The targets to try, best first (a subset is fine; never an empty list when
        ``targets`` is not empty)."""
        ...


Factory = Callable[[], Strategy]


class Registry:
    """Strategy name -> factory; built-ins first, then plugins found as entry points."""

    def __init__(self) -> None:
        self._factories: dict[str, Factory] = {}
        self.load_errors: dict[str, str] = {}

    def register(self, name: str, factory: Factory) -> None:
        self._factories[name] = factory

    def names(self) -> list[str]:
        return sorted(self._factories)

    def create(self, name: str) -> Strategy | None:
        factory = self._factories.get(name)
        if factory is None:
            return None
        strategy = factory()
        if not isinstance(strategy, Strategy):
            raise TypeError(f"strategy {name!r}: {factory!r} did not return a Strategy")
        return strategy

    def load_plugins(self, group: str = ENTRY_POINT_GROUP) -> list[str]:
        """Register every entry point of ``group``; returns the names added.  A plugin that
        fails to import is logged and recorded in ``load_errors``, never fatal."""
        added = []
        for ep in importlib.metadata.entry_points(group=group):
            if ep.name in self._factories:
                log.warning("strategy plugin shadows a known strategy; ignored", extra={
                    "event": "strategy_plugin_ignored", "strategy": ep.name,
                    "detail": ep.value})
                continue
            try:
                factory = ep.load()
            except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop the agent
                self.load_errors[ep.name] = f"{type(exc).__name__}: {exc}"
                log.error("cannot load strategy plugin", extra={
                    "event": "strategy_plugin_failed", "strategy": ep.name,
                    "detail": self.load_errors[ep.name]})
                continue
            if not callable(factory):
                self.load_errors[ep.name] = f"{ep.value} is not callable"
                continue
            self._factories[ep.name] = factory
            added.append(ep.name)
        return added
