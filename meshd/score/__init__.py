"""Scoring: rank a request's targets, admit or shed it, and choose when to hedge.

The scorer and its parts are sans-I/O (they take ``now``).  The score service (``service``:
the ``Score`` gRPC API), its per-request link for router workers (``link``) and the client
library for callers that route themselves (``client``) are the scorer's shells.  May import
``meshd.signals`` (the fused view it ranks), ``meshd.settings``, adapters, policy, certs and
proto; the router sits above it.
"""
