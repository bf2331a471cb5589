"""Training jobs: their specs, where they go (placement), who holds them (soft leases in the
placements group) and running them on trainers.

The decisions are pure (``spec``, ``placement``, ``ring``, ``leases``, ``board``,
``scheduler``); ``service`` and ``run`` are their asyncio shell; ``sample`` is a real job.
May import ``meshd.control`` (the placements group), ``meshd.signals`` (checked collective
timings), ``meshd.tracing``, adapters, consensus and policy.
"""
