"""``meshd-devmesh`` (``./dev mesh``): a local mesh of real meshd processes on one machine.

On Linux each node gets its own loopback address (127.0.0.1, 127.0.0.2, ...) with the default
ports; elsewhere (macOS and Windows only route 127.0.0.1) the nodes share 127.0.0.1 on
consecutive ports.

Security is on, as in production: node1 runs ``--dev`` and holds a CA made for this run; the
others enroll through it with a join token (handed over in the environment, not argv, which
other users can read), receive their certificates and the gossip key, and talk mTLS.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from certs import tls, tokens
from certs.ca import CertificateAuthority
from certs.identity import Identity
from meshd.ctl import format_members_table
from meshd.security import DEV_TRUST_DOMAIN
from proto.mesh.v1 import admin_pb2, admin_pb2_grpc

COORDINATORS = 3
"""The first nodes (up to this many) are coordinators and form the Raft groups."""


def node_addrs(i: int, per_ip: bool) -> tuple[str, str, str]:
    """Gossip, admin and metrics addresses of node ``i`` (1-based)."""
    if per_ip:
        ip = f"127.0.0.{i}"
        return f"{ip}:7946", f"{ip}:7960", f"{ip}:9464"
    return f"127.0.0.1:{7000 + i}", f"127.0.0.1:{7100 + i}", f"127.0.0.1:{9400 + i}"


def raft_addr(i: int, per_ip: bool) -> str:
    """Raft address of coordinator ``i`` (its groups use this port and the next)."""
    return f"127.0.0.{i}:7950" if per_ip else f"127.0.0.1:{7200 + 2 * i}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="meshd-devmesh", description=__doc__)
    p.add_argument("--nodes", type=int, default=5, help="number of meshd processes (default 5)")
    p.add_argument("--profile", default="lan", choices=["lan", "wan", "local"])
    p.add_argument("--interval", type=float, default=3.0, help="seconds between member tables")
    p.add_argument("--duration", type=float, default=0.0,
                   help="stop after this many seconds (default: run until Ctrl-C)")
    args = p.parse_args(argv)
    if not 1 <= args.nodes <= 250:
        p.error("--nodes must be 1..250")
    per_ip = sys.platform.startswith("linux")
    workdir = Path(tempfile.mkdtemp(prefix="meshd-devmesh-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHD_")}
    ca = CertificateAuthority.create(DEV_TRUST_DOMAIN)
    ca.save(workdir / "node1" / "ca")
    token, _ = tokens.create(ca, uses=max(1, args.nodes - 1), ttl=3600.0, now=time.time())
    roles = ["coordinator", "router", "gpu", "trainer", "edge"]
    procs: list[subprocess.Popen[bytes]] = []
    seed = node_addrs(1, per_ip)[0]
    print(f"starting {args.nodes} meshd nodes; logs and data under {workdir}", flush=True)
    for i in range(1, args.nodes + 1):
        gossip, admin, metrics = node_addrs(i, per_ip)
        cmd = [sys.executable, "-m", "meshd.cli", "--node", f"node{i}", "--bind", gossip,
               "--admin", admin, "--metrics", metrics, "--profile", args.profile,
               "--role", roles[(i - 1) % len(roles)], "--zone", f"zone-{'ab'[i % 2]}",
               "--region", "dev", "--data-dir", str(workdir / f"node{i}")]
        coordinators = min(COORDINATORS, args.nodes)
        if i <= coordinators:
            if roles[(i - 1) % len(roles)] != "coordinator":
                cmd += ["--role", "coordinator"]
            cmd += ["--bootstrap-expect", str(coordinators), "--raft", raft_addr(i, per_ip)]
        child_env = dict(env)
        if i == 1:
            cmd += ["--dev"]
        else:
            cmd += ["--join", seed, "--retry-join"]
            child_env["MESHD_JOIN_TOKEN"] = token
        log = open(workdir / f"node{i}.log", "wb")  # noqa: SIM115 - lives as long as the child
        procs.append(subprocess.Popen(cmd, env=child_env, stdout=log, stderr=log))
        if i == 1:
            time.sleep(0.5)
    stop = {"now": False}

    def on_signal(*_: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    admin_addr = node_addrs(1, per_ip)[1]
    creds = workdir / "node1" / "meshctl"
    started = time.monotonic()
    while not Identity.exists(creds) and time.monotonic() - started < 30:
        time.sleep(0.1)  # node1 writes the admin client identity as it starts
    ctl = f"meshctl --admin {admin_addr} --creds {creds}"
    print(f"try: {ctl} members --detailed\n     {ctl} raft status\n"
          f"     {ctl} cordon node2 && {ctl} policy list", flush=True)
    code = 0
    with tls.grpc_channel(admin_addr, Identity.load(creds)) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        while not stop["now"]:
            time.sleep(0.2)
            if any(pr.poll() is not None for pr in procs):
                dead = [i + 1 for i, pr in enumerate(procs) if pr.poll() is not None]
                print(f"node(s) {dead} exited; see their logs in {workdir}", file=sys.stderr)
                code = 1
                break
            elapsed = time.monotonic() - started
            if args.duration and elapsed >= args.duration:
                break
            if elapsed % args.interval < 0.2:
                try:
                    resp = stub.Members(admin_pb2.MembersRequest(), timeout=2)
                except grpc.RpcError as exc:
                    print(f"admin {admin_addr}: {exc.code().name}", flush=True)  # type: ignore[attr-defined]
                    continue
                alive = sum(m.status == "alive" for m in resp.members)
                print(f"\n[{time.strftime('%H:%M:%S')}] {alive}/{len(resp.members)} alive "
                      f"(as seen by node1; Ctrl-C stops the mesh)", flush=True)
                print(format_members_table(resp), flush=True)
    print("stopping: each node leaves gracefully", flush=True)
    for pr in procs:
        if pr.poll() is None:
            pr.send_signal(signal.SIGTERM)
    for pr in procs:
        try:
            pr.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pr.kill()
    return code


if __name__ == "__main__":
    sys.exit(main())
