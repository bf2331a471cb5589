"""One pysyncobj node over the TLS transport, as a child process of tests/test_raft_transport.py.

Not a test module.  Run as::

    python -m tests.raft_node --identity DIR --self 127.0.0.1:P1 \\
        --peer 127.0.0.1:P2 --peer 127.0.0.1:P3 --name 127.0.0.1:P1=n1 --name ...

It replicates a ``ReplCounter``, prints ``{"ready": ...}`` once listening, then answers one JSON
line on stdout per command line on stdin: ``status``, ``inc`` (a replicated increment with a
timeout) and ``quit``.  It exits when stdin closes, so a test run that dies takes its nodes with
it.  Logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.batteries import ReplCounter

from certs import tls
from certs.identity import Identity
from certs.verify import PeerVerifier
from consensus.transport import RaftTls, mesh_authorizer, tls_transport

SYNC_TIMEOUT = 5.0


def conf(bind: str) -> SyncObjConf:
    """Fast reconnects so a test does not wait pysyncobj's default 5 s between attempts."""
    return SyncObjConf(appendEntriesUseBatch=False, bindAddress=bind, connectionRetryTime=0.3,
                       connectionTimeout=2.0, dynamicMembershipChange=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--identity", type=Path, required=True)
    ap.add_argument("--self", dest="self_addr", required=True)
    ap.add_argument("--peer", action="append", default=[])
    ap.add_argument("--name", action="append", default=[], help="ADDR=NAME")
    ap.add_argument("--trust-domain", default="mesh.test")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")

    ident = Identity.load(args.identity)
    verifier = PeerVerifier(ident.bundle, args.trust_domain)
    refusals: list[str] = []
    settings = RaftTls(tls.server_context(args.identity), tls.client_context(args.identity),
                       mesh_authorizer(verifier), on_refused=refusals.append,
                       node_names=dict(n.split("=", 1) for n in args.name))
    cls = tls_transport(settings)
    counter = ReplCounter()
    node = SyncObj(args.self_addr, args.peer, conf(args.self_addr), consumers=[counter],
                   transportClass=cls)
    node.waitBinded()
    (transport,) = cls.instances

    def reply(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    reply({"ready": True, "self": args.self_addr})
    try:
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "status":
                leader = node._getLeader()  # pysyncobj has no public getter
                reply({"self": args.self_addr, "leader": None if leader is None else str(leader),
                       "counter": counter.get(), "commit": node.raftCommitIndex,
                       "connected": sorted(n.address for n in transport.connected_nodes),
                       "delivered": transport.delivered_messages,
                       "refused": dict(transport.refused), "on_refused": refusals})
            elif cmd == "inc":
                try:
                    reply({"value": counter.inc(sync=True, timeout=SYNC_TIMEOUT)})
                except Exception as exc:  # noqa: BLE001 - reported to the test
                    reply({"error": repr(exc)})
            elif cmd == "quit":
                break
            else:
                reply({"error": f"unknown command {cmd!r}"})
    finally:
        node.destroy_synchronous()
    return 0


if __name__ == "__main__":
    sys.exit(main())
