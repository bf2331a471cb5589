"""What the tests and the benches share, one copy of each.

- :mod:`testbed.cluster`: clusters of real meshd agents on loopback (one address and one port
  block per node, optionally inside a network namespace), killed with the process that made
  them; :mod:`testbed.raft`: the Raft ports and coordinator flags for clusters that run the
  Raft groups;
- :mod:`testbed.sim`: the deterministic simulator (SWIM cores on a virtual network, Vivaldi
  topologies, a synthetic internet);
- :mod:`testbed.admin`: an in-process admin API with real mTLS; :mod:`testbed.otlp`: an
  OTLP/gRPC trace receiver;
- :mod:`testbed.imports`: the repository's import rules, checked (``python -m testbed.imports``).

Free ports and child-process hygiene live in ``meshd.dev`` (:mod:`meshd.dev.ports`,
:mod:`meshd.dev.processes`), since the dev mesh needs them too.

testbed may import meshd and the libraries under it, never ``tests`` or ``bench`` (both import
testbed); nothing in meshd imports testbed, and it is not shipped.  Fakes (a fake NVML, a fake
GPU agent) stay in ``tests/``.
"""
