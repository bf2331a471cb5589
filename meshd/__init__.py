"""The meshd agent: wires gossip (and later topology, consensus, certs, adapters) into one
process with a CLI, settings, an admin API, metrics and logs."""

__version__ = "0.1.0"
