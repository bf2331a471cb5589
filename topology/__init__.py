"""Network topology: Vivaldi RTT coordinates, zone/region facts and RTT estimates.

A sans-I/O layer: ``VivaldiClient`` takes RTT samples and peers' coordinates as arguments and
returns its new coordinate; nothing here reads a clock or a socket, and nothing here imports
``gossip/`` — the agent plugs it into gossip's probe hook.
"""
