"""The security plane: this node's identity and the trust between nodes.

Owns the mesh identity (minted SPIFFE certificates, enrollment, renewal), the CA a node may
hold, revocations, join-token counts, the gossip keyring, mTLS channels to peers
(``peers``), the TLS front of the admin and router gRPC ports (``front``), the router's
counted HTTPS site (``https``) and the audit log (``audit``).  May import certs, gossip
(keys, transport security) and consensus (Raft's TLS transport); every plane above it takes
its TLS from here.
"""
