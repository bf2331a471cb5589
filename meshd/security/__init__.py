"""The security plane: this node's identity and the trust between nodes.

Owns the mesh identity (minted SPIFFE certificates, enrollment, renewal), the CA a node may
hold, revocations, join-token counts, the gossip keyring, and mTLS channels to peers
(``peers``).  May import certs, gossip (keys, transport security) and consensus (Raft's
TLS transport); every plane above it takes its TLS from here.
"""
