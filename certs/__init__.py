"""The mesh's own PKI: a mesh CA, SPIFFE node identities, join tokens, enrollment, revocation
and the TLS contexts every channel uses.

Air-gapped sites have no external CA, so meshd mints and checks its own identities.  Nothing
here does network I/O: enrollment is a request/response pair the agent carries over its own
TLS stream, which keeps this package testable without sockets.
"""
