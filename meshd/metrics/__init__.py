"""Metrics: every Prometheus series meshd exports and the endpoint that serves them.

Owns the schema (``schema``: names, types, labels, meaning), the collectors of each plane
(``agent``, ``routing``, ``train``) and the text exposition (``exposition``).  May import
every plane it reads (security, coordinates, signals, score, control, train, router);
nothing imports it but the agent.
"""
