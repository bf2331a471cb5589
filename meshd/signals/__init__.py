"""The signal plane: what each node can do right now, published through gossip and fused.

Owns the node-state blob (``nodestate``) and its routing to the layers that read it
(``readers``), the telemetry's wire form and patches (``wire``, ``patch``, ``publish``),
checked deltas from outside (``deltas``), the fused view of every node (``fused``), and
the plane itself (``plane``: adapters in, gossip and Subscribe streams out).  May import
adapters, gossip, proto and ``meshd.security``; scoring, control and routing read it.
"""
