"""The router role: Triton's own gRPC and HTTP protocols in front of the replicas.

Owns ingress (``kserve``, ``http``), what is done with a call (``gateway``: validate,
admit, score, hedge, forward), the upstream channels, worker processes sharing the port
(``pool``, ``worker``) and its counters.  May import ``meshd.score`` (the scorer, here or
over the score service), ``meshd.tracing``, ``meshd.logs``, ``meshd.settings``, certs and
proto.
"""
