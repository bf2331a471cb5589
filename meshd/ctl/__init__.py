"""``meshctl``: the operator's command line, a client of the admin API.

Owns argument parsing, one module per command family (``policy``, ``jobs``, ``state``),
and what meshctl prints and reads (``text``).  May import ``meshd.admin.rbac`` (the role
names), certs, policy (documents) and proto; nothing of the running agent.
"""
