"""The router role: KServe v2 gRPC ingress that scores, admits, hedges and forwards to Triton."""
