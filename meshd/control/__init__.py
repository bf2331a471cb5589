"""The control plane: replicated state every node reads and coordinators keep.

Owns the Raft groups on coordinators and the read copy on every node, the one write path
(local proposal or forwarding to the leader), and automatic quarantine (``health``, a
pure judgement of a node's own telemetry, and ``quarantine``, its shell).  May import
consensus, policy, gossip, ``meshd.security`` and ``meshd.signals``' wire form; a group's
store is handed in by the agent, so nothing here knows the training plane above it.
"""
