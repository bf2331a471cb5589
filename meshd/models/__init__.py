"""Models placed across the fleet: how many replicas each model needs and where they go.

The pure core: what the controller sees of the fleet (``fleet``: nodes, GPUs, models and
their pins), how many replicas a model's demand needs (``sizing``: target utilisation,
hysteresis, the scale-down cool-down), where they go (``plan``: the decisions the policy
group's leader proposes), and the replicated placement record those decisions are applied to
(``record``: an idempotent state machine, so a new leader continues and never repeats).  No
I/O, no clocks, no randomness: every function takes ``now``; these may import ``policy``
and nothing above it.

Around it: ``store``, the policy group's state machine holding the record beside the
policies (projected into ``ModelPlacement`` documents every node reads), and ``service``,
the asyncio shell (the controller on the policy leader; on each node with
``--model-control``, the enactor that loads and unloads through its Triton), which uses the
control plane and the fused signals below it (the package may import ``meshd.control`` and
the layers under it).
"""
