"""Models placed across the fleet: how many replicas each model needs and where they go.

Owns the placement controller's pure core: what it sees of the fleet (``fleet``: nodes, GPUs,
models and their pins), how many replicas a model's demand needs (``sizing``: target
utilisation, hysteresis, the scale-down cool-down), where they go (``plan``: the decisions
the policy group's leader proposes), and the replicated placement record those decisions
are applied to (``record``: an idempotent state machine, so a new leader continues and never
repeats).  No I/O, no clocks, no randomness: every function takes ``now``.  May import
``policy`` and nothing above it (it reads ModelPin specs); the agent, Raft, the Triton
adapter and the router wire it in from above.
"""
