"""``meshd-devmesh`` (``./dev mesh``): a local mesh of real meshd processes on one machine.

On Linux each node gets its own loopback address (127.0.0.1, 127.0.0.2, ...) with the default
ports; elsewhere (macOS and Windows only route 127.0.0.1) the nodes share 127.0.0.1 on
consecutive ports.

Security is on, as in production: node1 runs ``--dev`` and holds a CA made for this run; the
others enroll through it with a join token (handed over in the environment, not argv, which
other users can read), receive their certificates and the gossip key, and talk mTLS.

Runtimes: ``--tritons N`` (default 2) real CPU Triton servers (``meshd.dev.triton``, models
``add_sub`` and ``delay``) start first, on free ports of 127.0.0.1, and each is attached to one
node (``--triton``), node2 first, so ``meshctl state`` shows replicas and queues. They are
stopped after the nodes, however the mesh ends.

Prometheus: when the ``prometheus`` binary is installed (Debian's ``prometheus`` package), one
scrapes every node and Triton server with the rules of ``deploy/prometheus/``, on
http://127.0.0.1:9090 (or a free port); the dashboards of ``deploy/grafana/`` read it.
``--no-prometheus`` leaves it out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import grpc

from certs import tls, tokens
from certs.ca import CertificateAuthority
from certs.identity import Identity
from meshd.ctl.text import format_members_table
from meshd.dev import ports
from meshd.dev import prometheus as devprometheus
from meshd.dev import traffic as devtraffic
from meshd.dev import triton as devtriton
from meshd.security.plane import DEV_TRUST_DOMAIN
from proto.mesh.v1 import admin_pb2, admin_pb2_grpc

TRAINING_PARTNER = 5
"""This node is also a trainer, so the sample job runs as a gang over node4 and node5."""
SAMPLE_JOB = "devmesh-sample"
COORDINATORS = 3
"""The first nodes (up to this many) are coordinators and form the Raft groups."""

TRITON_TIMEOUT = 120.0
"""Seconds a Triton server may take to become ready (a loaded 2-core machine is slow)."""


def node_addrs(i: int, per_ip: bool) -> tuple[str, str, str]:
    """Gossip, admin and metrics addresses of node ``i`` (1-based)."""
    if per_ip:
        ip = f"127.0.0.{i}"
        return f"{ip}:7946", f"{ip}:7960", f"{ip}:9464"
    return f"127.0.0.1:{7000 + i}", f"127.0.0.1:{7100 + i}", f"127.0.0.1:{9400 + i}"


def score_addr(i: int, per_ip: bool) -> str:
    """Score API address of node ``i`` (loopback: plaintext)."""
    return f"127.0.0.{i}:7961" if per_ip else f"127.0.0.1:{7300 + i}"


def router_addr(i: int, per_ip: bool) -> str:
    """Router ingress of node ``i`` (served when it has the router role)."""
    return f"127.0.0.{i}:9000" if per_ip else f"127.0.0.1:{9500 + i}"


def router_http_addr(i: int, per_ip: bool) -> str:
    """Router HTTP/REST ingress of node ``i``."""
    return f"127.0.0.{i}:9001" if per_ip else f"127.0.0.1:{9600 + i}"


def raft_addr(i: int, per_ip: bool) -> str:
    """Raft address of coordinator ``i`` (its groups use this port and the next)."""
    return f"127.0.0.{i}:7950" if per_ip else f"127.0.0.1:{7200 + 2 * i}"


def triton_node(j: int, nodes: int) -> int:
    """The node (1-based) that Triton ``j`` (0-based) is attached to: node2, node3, ...,
    wrapping over node2..nodeN; node1 when it is the only node."""
    return 1 if nodes == 1 else 2 + j % (nodes - 1)


def tool(name: str, module: str) -> str:
    """How to run console script ``name`` from a shell: its bare name if ``PATH`` finds this
    interpreter's copy, else that copy's path (``./dev`` does not activate the venv), else
    ``python -m module``."""
    mine = Path(sys.executable).parent / name
    if mine.is_file():
        found = shutil.which(name)
        if found and Path(found).resolve() == mine.resolve():
            return name
        return str(mine)
    return f"{sys.executable} -m {module}"


def start_tritons(count: int, work: Path) -> list[devtriton.TritonServer]:
    """Start ``count`` Triton servers in parallel under ``work``; the ones that started.

    Triton being unavailable here, or a server failing to start, is reported and the mesh goes
    on without it: a server that fails is dropped and the others are started again (start_all
    stops them all when one fails)."""
    if count <= 0:
        return []
    reason = devtriton.unavailable_reason()
    if reason is not None:
        print(f"no Triton: {reason}; the mesh runs without runtimes", flush=True)
        return []
    try:
        servers = [devtriton.TritonServer(devtriton.DEFAULT_REPO, work / f"triton{j}",
                                          name=f"triton{j}") for j in range(count)]
    except (OSError, RuntimeError, ValueError) as e:
        print(f"no Triton: {e}; the mesh runs without runtimes", flush=True)
        return []
    print(f"starting {count} Triton server(s) (models add_sub, delay); logs under {work}",
          flush=True)
    began = time.monotonic()
    while servers:
        try:
            devtriton.start_all(servers, timeout=TRITON_TIMEOUT)
            break
        except devtriton.TritonStartError as e:  # the message ends with its log tail
            print(f"Triton failed to start: {e}", file=sys.stderr, flush=True)
            failed = [s for s in servers if s.name == e.server]
            servers = [s for s in servers if s.name != e.server]
            if servers:
                print(f"{', '.join(s.name for s in failed)} left out; starting "
                      f"{', '.join(s.name for s in servers)} again", file=sys.stderr, flush=True)
        except (devtriton.TritonUnavailable, OSError, RuntimeError) as e:  # not one server's
            print(f"Triton failed to start: {e}; the mesh runs without runtimes",
                  file=sys.stderr, flush=True)
            return []
    if servers:
        print(f"{len(servers)} Triton server(s) ready in {time.monotonic() - began:.1f} s",
              flush=True)
        devtriton.write_servers_file(work, servers)
    return servers


def start_prometheus(nodes: int, per_ip: bool, tritons: list[devtriton.TritonServer],
                     work: Path) -> devprometheus.PrometheusServer | None:
    """Prometheus scraping every node (and the Triton servers), or None when it is not
    installed or does not start (the mesh goes on without it)."""
    if devprometheus.binary() is None:
        print("no Prometheus (apt install prometheus to get one, with the dashboards' data)",
              flush=True)
        return None
    targets = [node_addrs(i, per_ip)[2] for i in range(1, nodes + 1)]
    port = 9090 if ports.port_free("127.0.0.1", 9090) else 0
    prom = devprometheus.PrometheusServer(
        work, targets, port=port, extra={"triton": [f"{s.host}:{s.metrics_port}" for s in tritons]})
    try:
        prom.start()
    except devprometheus.PrometheusError as exc:
        print(f"Prometheus failed to start: {exc}", file=sys.stderr, flush=True)
        return None
    print(f"Prometheus: {prom.url} scrapes the {nodes} nodes every 2 s, with the alert rules "
          f"of deploy/prometheus/\n     dashboards: import deploy/grafana/dashboards/*.json in "
          f"Grafana with {prom.url} as data source; or ask it: "
          f"curl '{prom.url}/api/v1/query?query=meshd:router_requests:rate1m'", flush=True)
    return prom


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="meshd-devmesh", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=5, help="number of meshd processes (default 5)")
    p.add_argument("--tritons", type=int, default=2,
                   help="real Triton servers to start and attach to nodes node2, node3, ... "
                        "(default 2; 0 = none)")
    p.add_argument("--profile", default="lan", choices=["lan", "wan", "local"])
    p.add_argument("--interval", type=float, default=3.0, help="seconds between member tables")
    p.add_argument("--requests", type=int, default=200,
                   help="requests sent through the router each traffic round (0: none)")
    p.add_argument("--duration", type=float, default=0.0,
                   help="stop after this many seconds (default: run until Ctrl-C)")
    p.add_argument("--no-training", action="store_true",
                   help="do not run the sample training job")
    p.add_argument("--no-prometheus", action="store_true",
                   help="do not start Prometheus even when it is installed")
    args = p.parse_args(argv)
    if not 1 <= args.nodes <= 250:
        p.error("--nodes must be 1..250")
    if args.tritons < 0:
        p.error("--tritons must be >= 0")
    per_ip = sys.platform.startswith("linux")
    workdir = Path(tempfile.mkdtemp(prefix="meshd-devmesh-"))
    stop = {"now": False}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop["now"] = True

    # While starting, Ctrl-C or SIGTERM interrupts (KeyboardInterrupt), and what has started is
    # stopped below; once running, they end the loop instead.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    procs: list[subprocess.Popen[bytes]] = []
    tritons: list[devtriton.TritonServer] = []
    prometheus: list[devprometheus.PrometheusServer] = []
    try:
        tritons = start_tritons(args.tritons, workdir / "triton")
        return _run(args, per_ip, workdir, procs, tritons, stop, on_signal, prometheus)
    except KeyboardInterrupt:
        _say("\ninterrupted")
        return 130
    except BrokenPipeError:  # stdout closed (`| head`): stop everything, quietly
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    finally:
        # Nodes first (they stop polling their Tritons), then the Tritons; never leave either,
        # even when stdout is gone (`| head`).
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        for prom in prometheus:
            prom.stop()
        if procs:
            _say("stopping: each node leaves gracefully")
        for pr in procs:
            if pr.poll() is None:
                pr.send_signal(signal.SIGTERM)
        for pr in procs:
            try:
                pr.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pr.kill()
                pr.wait()
        if tritons:
            _say(f"stopping {len(tritons)} Triton server(s)")
            devtriton.stop_all(tritons)


def _say(line: str) -> None:
    """Print ``line``, unless stdout is closed: shutting down must not fail on it."""
    with contextlib.suppress(OSError, ValueError):
        print(line, flush=True)


def _run(args: argparse.Namespace, per_ip: bool, workdir: Path,
         procs: list[subprocess.Popen[bytes]], tritons: list[devtriton.TritonServer],
         stop: dict[str, bool], on_signal: Callable[[int, FrameType | None], None],
         prometheus: list[devprometheus.PrometheusServer]) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHD_")}
    ca = CertificateAuthority.create(DEV_TRUST_DOMAIN)
    ca.save(workdir / "node1" / "ca")
    token, _ = tokens.create(ca, uses=max(1, args.nodes - 1), ttl=3600.0, now=time.time())
    roles = ["coordinator", "router", "gpu", "trainer", "edge"]
    seed = node_addrs(1, per_ip)[0]
    attached: dict[int, list[devtriton.TritonServer]] = {}
    for j, server in enumerate(tritons):
        attached.setdefault(triton_node(j, args.nodes), []).append(server)
    print(f"starting {args.nodes} meshd nodes; logs and data under {workdir}", flush=True)
    for i in range(1, args.nodes + 1):
        gossip, admin, metrics = node_addrs(i, per_ip)
        cmd = [sys.executable, "-m", "meshd.cli", "--node", f"node{i}", "--bind", gossip,
               "--admin", admin, "--score", score_addr(i, per_ip), "--metrics", metrics,
               "--router", router_addr(i, per_ip), "--router-http", router_http_addr(i, per_ip),
               "--profile", args.profile,
               "--role", roles[(i - 1) % len(roles)], "--zone", f"zone-{'ab'[i % 2]}",
               "--region", "dev", "--data-dir", str(workdir / f"node{i}")]
        coordinators = min(COORDINATORS, args.nodes)
        if i <= coordinators:
            if roles[(i - 1) % len(roles)] != "coordinator":
                cmd += ["--role", "coordinator"]
            cmd += ["--bootstrap-expect", str(coordinators), "--raft", raft_addr(i, per_ip)]
        if i == TRAINING_PARTNER:
            cmd += ["--role", "trainer"]  # with node4, a gang of two for the sample job
        if roles[(i - 1) % len(roles)] == "router" and sys.platform.startswith("linux"):
            cmd += ["--router-workers", "2"]  # the port served by two processes
        for server in attached.get(i, []):
            cmd += ["--triton", server.meshd_spec]
            print(f"  {server.name} (gRPC {server.grpc_url}, HTTP {server.host}:"
                  f"{server.http_port}) -> node{i}", flush=True)
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
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    admin_addr = node_addrs(1, per_ip)[1]
    creds = workdir / "node1" / "meshctl"
    started = time.monotonic()
    while not Identity.exists(creds) and time.monotonic() - started < 30 and not stop["now"]:
        time.sleep(0.1)  # node1 writes the admin client identity as it starts
    if stop["now"]:
        return 0
    ctl = f"{tool('meshctl', 'meshd.ctl')} --admin {admin_addr} --creds {creds}"
    print(f"try: {ctl} members --detailed\n     {ctl} raft status\n"
          f"     {ctl} cordon node2 && {ctl} policy list", flush=True)
    if tritons:
        print(f"     {ctl} state        # replicas, queues, each figure's age\n"
              f"     {tool('meshd-devtriton', 'meshd.dev.triton')} behave "
              f"--work-dir {workdir / 'triton'} --server {tritons[0].name} --model delay "
              f"--delay-ms 200        # {tritons[0].name}'s delay model gets slow "
              f"(no --delay-ms: normal again)", flush=True)
    if not args.no_prometheus:
        prom = start_prometheus(args.nodes, per_ip, tritons, workdir / "prometheus")
        if prom is not None:
            prometheus.append(prom)
    reported: set[str] = set()
    router_nodes = [i for i in range(1, args.nodes + 1) if roles[(i - 1) % len(roles)] == "router"]
    traffic_stop = threading.Event()
    if tritons and router_nodes and args.requests > 0:
        router = router_addr(router_nodes[0], per_ip)
        https = router_http_addr(router_nodes[0], per_ip)
        print(f"     router: Triton's gRPC at {router}, HTTPS at {https} (mTLS with {creds});"
              f" traffic rounds of {args.requests} requests show where they went", flush=True)
        print(f"       tritonclient.grpc.InferenceServerClient('{router}', ssl=True, "
              f"root_certificates='{creds}/bundle.pem', private_key='{creds}/key.pem', "
              f"certificate_chain='{creds}/cert.pem')", flush=True)
        print(f"       curl --cacert {creds}/bundle.pem --cert {creds}/cert.pem --key "
              f"{creds}/key.pem https://{https}/v2/models/add_sub", flush=True)
        threading.Thread(target=_traffic, args=(router, creds, tritons, args, traffic_stop),
                         daemon=True).start()
    with tls.grpc_channel(admin_addr, Identity.load(creds)) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        if args.nodes >= TRAINING_PARTNER and not args.no_training:
            threading.Thread(target=_training, args=(stub, workdir, traffic_stop, ctl),
                             daemon=True).start()
        while not stop["now"]:
            time.sleep(0.2)
            if stop["now"]:
                break  # Ctrl-C in a terminal also reached the nodes: they are leaving
            if any(pr.poll() is not None for pr in procs):
                dead = [i + 1 for i, pr in enumerate(procs) if pr.poll() is not None]
                print(f"node(s) {dead} exited; see their logs in {workdir}", file=sys.stderr)
                return 1
            for server in tritons:
                if server.name not in reported and not server.is_running():
                    reported.add(server.name)
                    print(f"{server.name} exited; log {server.log_path}:\n"
                          f"{server.log_tail(10)}", file=sys.stderr, flush=True)
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
    traffic_stop.set()
    return 0


def _training(stub: admin_pb2_grpc.AdminStub, workdir: Path, stop: threading.Event,
              ctl: str) -> None:
    """Submit the sample job as a gang of two CPU ranks (node4 and node5), once the Raft
    groups take writes; it runs until the mesh stops, reporting its all-reduce timings."""
    spec = {"id": SAMPLE_JOB, "model": "logreg", "entry": "meshd.train.sample:main",
            "checkpoints": str(workdir / "checkpoints"), "gpus": {"count": 0, "nodes": 2},
            "hyperparameters": {"steps": 10_000_000, "step_seconds": 0.2,
                                "checkpoint_every": 25}}
    request = admin_pb2.SubmitJobRequest(spec=json.dumps(spec), timeout_seconds=5)
    while not stop.wait(2.0):
        try:
            last = list(stub.SubmitJob(request, timeout=10))[-1:]
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:  # type: ignore[attr-defined]
                _say(f"training: the sample job was refused: {exc.details()}")  # type: ignore[attr-defined]
                return
            continue  # not ready yet (no quorum, trainers not seen yet): again
        state = last[0].state if last else "submitted"
        _say(f"training: the sample job {SAMPLE_JOB} is {state}, a gang of two CPU ranks on "
             f"node4 and node5\n     {ctl} jobs get {SAMPLE_JOB}")
        return


def _traffic(router: str, creds: Path, tritons: list[devtriton.TritonServer],
             args: argparse.Namespace, stop: threading.Event) -> None:
    """Rounds of tritonclient requests through the router, each followed by where they went
    (read from the Triton servers' own statistics)."""
    client = devtraffic.router_client(router, creds, DEV_TRUST_DOMAIN)
    if not devtraffic.wait_ready(client, 90, stop):
        if not stop.is_set():
            _say(f"traffic: the router at {router} never had both models ready")
        return
    while not stop.is_set():
        _say(devtraffic.round_of(client, tritons, args.requests, 4))
        stop.wait(max(args.interval, 5.0))


if __name__ == "__main__":
    sys.exit(main())
