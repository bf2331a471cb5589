"""The admin plane: the gRPC services operators and peers call on a node's admin port.

Owns the ``Admin`` service (members, keys, tokens, policies, flags, jobs), the node-to-node
``Consensus`` service, the ``StatePlane`` service, and who may call which method: mTLS and
JWT principals, roles, the audit log (``authz``, ``rbac``).  May import every plane it
serves (control, signals, security, train, coordinates) and the libraries; the agent and
``ctl`` sit above it.
"""
