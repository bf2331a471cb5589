"""Whose fault an error is: the request's or the replica's.  Only a replica's fault is worth
another replica's time.

Triton answers INTERNAL for two different things.  A model that refuses this request (a
Python model's error response, an exception its code raised about the input, a backend's
complaint about a shape) gives the same answer on every replica that runs the same model, so
failing over would run a bad request on the whole fleet and tell the client "every replica
failed".  A replica that cannot run the model now (its Python stub died, CUDA failed, memory
or the backend's shared memory pool ran out, the model or server is not ready or is shutting
down) is exactly what failover is for.  Triton does not tell the two apart by code, so the
words decide: the faults of a replica are few and recognisable, and everything else a model
says is taken to be about the request.  UNAVAILABLE and RESOURCE_EXHAUSTED (unreachable, or
the replica shed the request) and UNKNOWN (the transport broke) are always the replica's;
every other code (INVALID_ARGUMENT, NOT_FOUND, ...) is always the request's.
"""

from __future__ import annotations

import re

import grpc

REPLICA_FAULTS = re.compile(
    r"stub process|not healthy|unhealthy|\bcuda\b|cudnn|cublas|out of memory|\boom\b"
    r"|failed to allocate|cannot allocate|allocation failed|shared memory pool"
    r"|not ready|shutting down|server is stopping|socket closed|connection reset"
    r"|broken pipe|stream removed|failed to connect|connection refused|timed out",
    re.IGNORECASE)
"""What a replica that cannot run the model says, in Triton's and its backends' words."""

ALWAYS_REPLICA = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                            grpc.StatusCode.UNKNOWN})
"""Codes that say "this replica, now", whatever the message."""

HTTP_REPLICA = frozenset({503, 429})
"""HTTP answers that say "this replica, now" (UNAVAILABLE, RESOURCE_EXHAUSTED)."""

_SCANNED = 4096
"""Bytes of an HTTP error body read for the words (Triton's ``{"error": ...}`` is short)."""


def replica_fault(code: grpc.StatusCode, details: str) -> bool:
    """True when another replica may answer a gRPC error differently."""
    if code in ALWAYS_REPLICA:
        return True
    return code == grpc.StatusCode.INTERNAL and REPLICA_FAULTS.search(details) is not None


def replica_fault_http(status: int, body: bytes) -> bool:
    """True when another replica may answer an HTTP error differently (500 is Triton's
    INTERNAL: its body's words decide)."""
    if status in HTTP_REPLICA:
        return True
    if status != 500:
        return False
    return REPLICA_FAULTS.search(body[:_SCANNED].decode("utf-8", "replace")) is not None
