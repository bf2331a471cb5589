"""Replicated state (policies) on pysyncobj's Raft, reachable only over the mesh's mutual TLS.

pysyncobj speaks pickle and its port takes membership commands, so its own TCP transport must
never be used: :mod:`consensus.transport` carries its messages over mTLS with the mesh
certificates, and nothing reaches the Raft layer before the peer's certificate was checked.
"""
