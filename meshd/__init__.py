"""The meshd agent: one process per node that joins the mesh, publishes what its node can do,
and routes, places and governs on that knowledge.

Packages, lowest first (``docs/architecture.md`` draws them; ``testbed/imports.py`` holds
the order and the test suite checks it): plumbing (``logs``, ``tracing``, ``collector``,
``settings``), ``security``, ``coordinates``, ``signals``, ``score``, ``control``,
``train``, ``router``, ``metrics``, ``admin``, ``ctl``, then ``agent`` and ``cli`` that
wire them into a process, and ``dev`` (the local mesh).  A package imports its own modules,
the packages below it and the libraries under the agent (gossip, topology, certs, policy,
consensus, adapters, proto); never one above it.
"""

__version__ = "0.1.0"
