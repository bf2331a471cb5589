"""Development tools: the local mesh (``./dev mesh``) and the real servers it and the tests run.

Owns real Triton servers on loopback (``triton``), a real Prometheus (``prometheus``),
traffic through the router (``traffic``), the mesh itself (``mesh``), and the ports and
child processes they need (``ports``, ``processes``), which tests and benches share.  Sits
at the top: it may import anything in meshd; nothing in meshd imports it.
"""
