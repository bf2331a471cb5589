"""Security plane: certificate issue time, what mTLS + RBAC add to an admin call, and 32 nodes
enrolled through one CA holder.

    .venv/bin/python bench/security.py [--quick] [--only issue,admin,enroll]

Sections (``--only`` keys):

* ``issue`` - ``CertificateAuthority.issue(csr, ["node"])`` of a pre-made CSR (EC P-256, one
  SPIFFE node ID), ``--issues`` times, ``perf_counter_ns`` around each call: p50, p99, mean.
  Bar: p50 <= 2 ms.  For context, the CA holder's whole enrollment step,
  ``certs.enroll.Authority.handle({"op": "enroll", "token", "csr"})``: token MAC and expiry,
  CSR checks, the ledger (in memory, ``path=None``), signing and the reply's DER chain.
* ``admin`` - the admin gRPC API on loopback, four servers in this process over one
  ``AdminService`` (a ``Swim`` with 32 alive members with zones, ports, tags and Vivaldi
  coordinates): plaintext with no interceptor and mTLS with no interceptor (bench-only servers:
  meshd never serves either), mTLS + the RBAC interceptor with ``--audit-log off``, and mTLS +
  RBAC + the audit log written to a file (what meshd runs by default).  The client is a separate
  process (``grpc`` sync stubs, one long-lived channel per server, so handshakes are out of the
  numbers) making sequential unary calls: ``--warmup`` calls per server and method, then
  ``--calls`` per server and method in blocks of ``--block``, the order rotated each round, so
  drift on the machine is spread over all of them.  ``Members`` (read-only; 32 rows) is the
  comparison; ``Rtt`` (a small reply) shows the fixed per-call cost; ``Whoami`` needs the
  interceptor (context).  Bar: the p50 of mTLS + RBAC + audit <= 1.2x the plaintext p50.
  In-process context rows: the ``Members`` handler alone, ``PeerVerifier.verify_pem`` on a
  cached certificate and ``AuditLog.record`` in a tight loop.
* ``enroll`` - 32 real meshd processes (``testbed/cluster.py``, LAN profile, ``provision=False``):
  n1 holds the CA (``--ca-dir``); once its admin API answers, n2..n32 start at once with
  ``MESHD_JOIN_TOKEN`` (one token, 31 uses) and enroll through n1's gossip port.  Measured from
  the first of those 31 starts: every one has ``identity/cert.pem`` (polled every 20 ms), and
  ``Cluster.wait_converged()`` (every node's admin API lists all 32 alive, polled).  Also from
  the logs: the first and last ``enrolled``, and the last ``member_join`` that completed a
  node's table (convergence without polling).  n1's
  ``meshd_security_issued_certificates_total{op="enroll"}`` must be 31.  ``--runs`` runs
  (1 with ``--quick``), median and max.  Bar: converged <= 10 s (max over runs).

The machine may be shared: before each measurement the bench waits (up to ``--settle`` s) until
other processes use <= 0.3 cores, and it reports the CPU other processes used before and during
each measurement (from ``/proc/stat``, minus this process, its client and the agents).

Prints one table and writes ``bench/results/security.json``.  ``--quick`` runs fewer calls and
one cluster run (a smoke check) and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder comes first on sys.path and a bench module could shadow
# a package of the project (bench/consensus.py): put the project root first instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.table import (  # noqa: E402
    loadavg,
    machine_busy_s,
    machine_info,
    print_table,
    proc_cpu_s,
)

SECTIONS = ("issue", "admin", "enroll")
TRUST_DOMAIN = "mesh.test"
ISSUE_BAR_MS = 2.0
MTLS_BAR_RATIO = 1.20
CONVERGE_BAR_S = 10.0
N_NODES = 32
ADMIN_MEMBERS = 32
SERVERS = ("plaintext", "mtls_only", "mtls_no_audit", "mtls_audit")
METHODS = ("Members", "Rtt", "Whoami")
QUIET_CORES = 0.3
SERVER_LABEL = {"plaintext": "plaintext, no auth (bench-only server)",
                "mtls_only": "mTLS, no interceptor (bench-only server)",
                "mtls_audit": "mTLS + RBAC + audit log to a file",
                "mtls_no_audit": "mTLS + RBAC, audit off"}


def _quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile of a non-empty list."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary_ms(ns: list[int]) -> dict[str, float]:
    ms = [v / 1e6 for v in ns]
    return {"n": len(ms), "p50_ms": statistics.median(ms), "p99_ms": _quantile(ms, 0.99),
            "mean_ms": statistics.fmean(ms), "min_ms": min(ms), "max_ms": max(ms)}


def wait_quiet(max_wait: float, cores: float = QUIET_CORES, window: float = 2.0
               ) -> dict[str, Any]:
    """Wait (at most ``max_wait`` s) until other processes use <= ``cores`` of the machine
    over ``window`` s: the machine is shared, and 31 agents starting at once on two cores
    are slowed by anything else that runs.  Returns what was seen, for the report."""
    t0 = time.monotonic()
    said = False
    while True:
        b0, s0 = machine_busy_s(), proc_cpu_s(os.getpid())
        time.sleep(window)
        b1, s1 = machine_busy_s(), proc_cpu_s(os.getpid())
        if b0 is None or b1 is None or s0 is None or s1 is None:
            return {"waited_s": time.monotonic() - t0, "other_cores": None, "quiet": None}
        busy = max(0.0, (b1 - b0 - (s1 - s0)) / window)
        waited = time.monotonic() - t0
        if busy <= cores or waited >= max_wait:
            if said or busy > cores:
                print(f"    machine {'quiet' if busy <= cores else 'still busy'} after "
                      f"{waited:.0f} s ({busy:.2f} cores used by others)", file=sys.stderr,
                      flush=True)
            return {"waited_s": waited, "other_cores": busy, "quiet": busy <= cores}
        if not said:
            print(f"    other processes use {busy:.2f} cores; waiting up to {max_wait:.0f} s "
                  f"for <= {cores:g}", file=sys.stderr, flush=True)
            said = True


# --- issue ------------------------------------------------------------------------------------


def issue_bench(n: int) -> dict[str, Any]:
    from cryptography.hazmat.primitives.serialization import Encoding

    from certs import enroll, tokens
    from certs.ca import CertificateAuthority
    from certs.identity import make_csr, new_key
    from certs.spiffe import SpiffeId
    from certs.verify import PeerVerifier

    ca = CertificateAuthority.create(TRUST_DOMAIN)
    csr = make_csr(new_key(), SpiffeId.node(TRUST_DOMAIN, "n1"))
    for _ in range(min(200, n)):
        ca.issue(csr, ["node"])
    issue_ns = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        ca.issue(csr, ["node"])
        issue_ns.append(time.perf_counter_ns() - t0)

    holder = ca.mint(SpiffeId.node(TRUST_DOMAIN, "ca-holder"), ["node"])
    authority = enroll.Authority(
        identity=lambda: holder, verifier=PeerVerifier(ca.bundle, TRUST_DOMAIN), ca=ca,
        ledger=tokens.TokenLedger(None), gossip_keys=lambda: [os.urandom(32)],
        ca_holders=lambda: [], name_in_use=lambda _name: False)
    token, _ = tokens.create(ca, uses=tokens.MAX_USES, ttl=3600, now=time.time())
    msg: dict[str, object] = {"op": "enroll", "token": token,
                              "csr": csr.public_bytes(Encoding.DER)}
    warm = min(200, n)
    calls = min(n, tokens.MAX_USES - warm)
    for _ in range(warm):
        authority.handle(msg, None)
    enroll_ns = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        reply = authority.handle(msg, None)
        enroll_ns.append(time.perf_counter_ns() - t0)
    if not reply.get("ok"):
        raise RuntimeError(f"enrollment refused: {reply}")
    # Parts of the enrollment step, for the notes: token check and CSR check alone.
    parts: dict[str, float] = {}
    k = min(n, 1000)
    t0 = time.perf_counter_ns()
    for _ in range(k):
        tokens.check(ca, token, time.time())
    parts["token_check_ms"] = (time.perf_counter_ns() - t0) / k / 1e6
    t0 = time.perf_counter_ns()
    for _ in range(k):
        ca.check_csr(csr)
    parts["check_csr_ms"] = (time.perf_counter_ns() - t0) / k / 1e6
    return {"issue": _summary_ms(issue_ns), "enroll_handle": _summary_ms(enroll_ns),
            "enroll_parts": parts, "issued_by_authority": authority.issued}


# --- admin: servers in this process, the client in another ------------------------------------


def _admin_state(n_members: int) -> tuple[Any, Any]:
    """A ``Swim`` with ``n_members`` alive members (itself included) and a coordinate plane
    that has a coordinate for every peer, so ``Members`` fills every field."""
    from gossip.config import Config
    from gossip.protocol import Swim
    from gossip.state import ROLES, Member, NodeMeta, Status
    from meshd.coordinates import CoordinatePlane
    from topology import wire
    from topology.coordinate import Coordinate
    from topology.zones import Place

    rng = random.Random(7)

    def meta(i: int) -> NodeMeta:
        return NodeMeta.build([ROLES[i % len(ROLES)]], f"z{i % 4}", f"r{i % 2}",
                              {"gossip": 7946, "admin": 7947, "metrics": 9100},
                              {"rack": f"rack-{i % 8}", "env": "bench"})

    swim = Swim(Config.local(), "n0", ("127.0.0.1", 7946), meta(0), now=0.0)
    members = {f"n{i}": Member(f"n{i}", (f"10.0.{i // 250}.{i % 250 + 1}", 7946), 1,
                               Status.ALIVE, meta=meta(i))
               for i in range(1, n_members)}
    swim.restore(members)
    plane = CoordinatePlane("n0", place_of=lambda n: (
        Place(m.meta.zone, m.meta.region) if (m := swim.member(n)) else None))
    for m in members.values():
        c = Coordinate(tuple(rng.uniform(-0.01, 0.01) for _ in range(8)), 0.2, 0.0, 1e-4)
        for _ in range(3):
            plane.probe_acked(m, rng.uniform(0.001, 0.02), wire.encode(c))
    return swim, plane


async def _admin_servers(spec: dict[str, Any]) -> dict[str, Any]:
    import grpc

    from certs import tls
    from meshd.admin.server import AdminService
    from meshd.control.plane import ControlPlane
    from meshd.dev.ports import free_port
    from proto.mesh.v1 import admin_pb2_grpc
    from testbed.admin import dev_security, start_admin

    tmp = Path(tempfile.mkdtemp(prefix="bench-security-admin-"))
    try:
        sec = dev_security(tmp, "n0")
        swim, plane = _admin_state(ADMIN_MEMBERS)

        def clock() -> float:
            return 1000.0

        control = ControlPlane(swim.name, sec.dir, sec, coordinator=False)
        control.attach(swim, None, "")
        ports = {s: free_port() for s in SERVERS}
        service = AdminService(swim, clock, plane, sec, control)
        plain = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        admin_pb2_grpc.add_AdminServicer_to_server(service, plain)
        plain.add_insecure_port(f"127.0.0.1:{ports['plaintext']}")
        await plain.start()
        # mTLS alone: the handshake's and the records' cost without the RBAC interceptor.
        bare = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        admin_pb2_grpc.add_AdminServicer_to_server(service, bare)
        bare.add_secure_port(f"127.0.0.1:{ports['mtls_only']}",
                             tls.grpc_server_credentials(lambda: sec.identity))
        await bare.start()
        audit_path = tmp / "audit.log"
        servers = [plain, bare,
                   await start_admin(swim, clock, plane, sec, ports["mtls_audit"],
                                     audit_log=str(audit_path)),
                   await start_admin(swim, clock, plane, sec, ports["mtls_no_audit"],
                                     audit_log="off")]
        try:
            client_spec = {**spec, "creds": str(sec.dir / "meshctl"),
                           "targets": {s: {"port": p, "tls": s != "plaintext"}
                                       for s, p in ports.items()}}
            cpu0, busy0, wall0 = time.process_time(), machine_busy_s(), time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(Path(__file__).resolve()), "--admin-client",
                json.dumps(client_spec), stdout=asyncio.subprocess.PIPE, cwd=ROOT)
            out, _ = await proc.communicate()
            server_cpu = time.process_time() - cpu0
            busy1, wall = machine_busy_s(), time.monotonic() - wall0
            if proc.returncode != 0:
                raise RuntimeError(f"admin client exited with {proc.returncode}")
            result: dict[str, Any] = json.loads(out)
        finally:
            for s in servers:
                await s.stop(0)
        result["audit_records"] = sum(1 for _ in audit_path.open()) if audit_path.exists() else 0
        result["server_process_cpu_s"] = server_cpu
        result["wall_s"] = wall
        if busy0 is not None and busy1 is not None:
            # The client's CPU is in the machine total; what is left is other processes'.
            result["other_processes_cpu_s"] = (busy1 - busy0 - server_cpu
                                               - result["client_cpu_s"])
        result["parts"] = _interceptor_parts(sec, tmp, spec["parts_calls"])
        result["parts"]["members_handler_us"] = await _handler_alone(
            AdminService(swim, clock, plane, sec, control), spec["parts_calls"] // 10)
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def _handler_alone(svc: Any, n: int) -> float:
    """``AdminService.Members`` called directly (no gRPC): the handler's own cost, us."""
    from proto.mesh.v1 import admin_pb2

    req = admin_pb2.MembersRequest()
    for _ in range(min(n, 200)):
        await svc.Members(req, None)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        (await svc.Members(req, None)).SerializeToString()
    return (time.perf_counter_ns() - t0) / n / 1e3


def _interceptor_parts(sec: Any, tmp: Path, n: int) -> dict[str, float]:
    """Per-call cost (us) of what the RBAC interceptor does besides the handler."""
    from cryptography.hazmat.primitives.serialization import Encoding

    from certs.identity import Identity
    from meshd.admin.rbac import AuditLog, Principal
    from meshd.admin.server import default_policy

    client = Identity.load(sec.dir / "meshctl")
    pem = client.chain[0].public_bytes(Encoding.PEM)
    verifier = sec.verifier
    verifier.verify_pem(pem)  # fill the cache
    out: dict[str, float] = {}

    def per_call(fn: Any) -> float:
        for _ in range(min(n, 500)):
            fn()
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        return (time.perf_counter_ns() - t0) / n / 1e3

    out["verify_pem_cached_us"] = per_call(lambda: verifier.verify_pem(pem))
    peer = verifier.verify_pem(pem)
    principal = Principal(peer.spiffe_id.kind, peer.spiffe_id.name, peer.roles,
                          spiffe_id=str(peer.spiffe_id))
    policy = default_policy()
    out["policy_allows_us"] = per_call(lambda: policy.allows(principal, "Members"))
    with AuditLog(tmp / "parts-audit.log") as audit:
        out["audit_record_file_us"] = per_call(lambda: audit.record(
            method="Members", principal=principal, allowed=True, code="OK",
            peer="ipv4:127.0.0.1:54321"))
    with AuditLog(None) as off:
        out["audit_record_off_us"] = per_call(lambda: off.record(
            method="Members", principal=principal, allowed=True, code="OK",
            peer="ipv4:127.0.0.1:54321"))
    return out


def admin_client(spec: dict[str, Any]) -> dict[str, Any]:
    """The client process: sequential unary calls, one long-lived channel per server."""
    import grpc

    from certs import tls
    from certs.identity import Identity
    from proto.mesh.v1 import admin_pb2, admin_pb2_grpc

    ident = Identity.load(Path(spec["creds"]))
    channels: dict[str, Any] = {}
    for name, t in spec["targets"].items():
        target = f"127.0.0.1:{t['port']}"
        channels[name] = (tls.grpc_channel(target, ident) if t["tls"]
                          else grpc.insecure_channel(target))
    requests = {"Members": admin_pb2.MembersRequest(), "Rtt": admin_pb2.RttRequest(a="n1"),
                "Whoami": admin_pb2.WhoamiRequest()}
    plan = [(s, m) for m in METHODS for s in SERVERS
            if not (m == "Whoami" and s in ("plaintext", "mtls_only"))]
    calls = {key: getattr(admin_pb2_grpc.AdminStub(channels[key[0]]), key[1]) for key in plan}
    info: dict[str, Any] = {}
    for key in plan:
        fn, req = calls[key], requests[key[1]]
        for _ in range(spec["warmup"]):
            resp = fn(req, timeout=10)
        info[f"{key[0]}/{key[1]}"] = {"response_bytes": resp.ByteSize()}
        if key[1] == "Members":
            info[f"{key[0]}/{key[1]}"]["members"] = len(resp.members)
        elif key[1] == "Whoami":
            info[f"{key[0]}/{key[1]}"]["principal"] = resp.principal
    lat: dict[str, list[int]] = {f"{s}/{m}": [] for s, m in plan}
    block = spec["block"]
    rounds = -(-spec["calls"] // block)
    for r in range(rounds):
        order = plan[r % len(plan):] + plan[:r % len(plan)]
        for key in order:
            fn, req, out = calls[key], requests[key[1]], lat[f"{key[0]}/{key[1]}"]
            for _ in range(min(block, spec["calls"] - r * block)):
                t0 = time.perf_counter_ns()
                fn(req, timeout=10)
                out.append(time.perf_counter_ns() - t0)
    for ch in channels.values():
        ch.close()
    return {"latency": {k: _summary_ms(v) for k, v in lat.items()}, "responses": info,
            "client_cpu_s": proc_cpu_s(os.getpid()) or time.process_time()}


def admin_bench(calls: int, warmup: int, block: int, parts_calls: int) -> dict[str, Any]:
    spec = {"calls": calls, "warmup": warmup, "block": block, "parts_calls": parts_calls}
    result = asyncio.run(_admin_servers(spec))
    lat = result["latency"]
    base = lat["plaintext/Members"]["p50_ms"]
    result["ratio_p50"] = {s: lat[f"{s}/Members"]["p50_ms"] / base for s in SERVERS}
    rtt = lat["plaintext/Rtt"]["p50_ms"]
    result["ratio_p50_rtt"] = {s: lat[f"{s}/Rtt"]["p50_ms"] / rtt for s in SERVERS}
    result["setup"] = {**spec, "members": ADMIN_MEMBERS, "client": "separate process, grpc "
                       "sync stubs", "server": "grpc.aio in this process, one event loop"}
    return result


# --- enroll: 32 real processes ----------------------------------------------------------------


def _log_time(entry: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(str(entry["ts"]).replace("Z", "+00:00")).timestamp()


def enroll_run(workdir: Path, n: int, timeout: float) -> dict[str, Any]:
    from certs import tokens
    from certs.ca import CertificateAuthority
    from testbed.cluster import Cluster, RpcFailed, metric_sum

    # The CA first, so the token can be put in every joiner's environment up front (the
    # Cluster loads a CA it finds in workdir/ca).
    ca_dir = workdir / "ca"
    CertificateAuthority.create(TRUST_DOMAIN).save(ca_dir)
    ca = CertificateAuthority.load(ca_dir)
    token, claims = tokens.create(ca, uses=n - 1, ttl=600, now=time.time())
    loadavg_before = loadavg()
    c = Cluster(n, workdir, profile="lan", provision=False,
                node_args=lambda i: ["--ca-dir", str(ca_dir)] if i == 1 else [],
                node_env=lambda i: {} if i == 1 else {"MESHD_JOIN_TOKEN": token})
    try:
        seed = c.seed
        t_seed = time.time()
        seed.start()

        def seed_up() -> bool:
            if not seed.running:
                raise RuntimeError(f"n1 exited:\n{c.tail(seed)}")
            try:
                seed.members(timeout=1.0)
            except RpcFailed:
                return False
            return True

        c.wait_for(seed_up, 30, "n1 (CA holder) answering its admin API", interval=0.05)
        seed_ready = time.time() - t_seed
        joiners = c.nodes[1:]
        busy0, self0 = machine_busy_s(), proc_cpu_s(os.getpid())
        seed_cpu0 = proc_cpu_s(seed.pid) or 0.0
        t0 = time.time()
        for node in joiners:
            node.start()
        t_last_start = time.time()
        have_id: dict[str, float] = {}
        deadline = time.monotonic() + timeout
        while len(have_id) < len(joiners):
            for node in joiners:
                if node.name not in have_id and (node.data_dir / "identity"
                                                 / "cert.pem").exists():
                    have_id[node.name] = time.time() - t0
                if not node.running:
                    raise RuntimeError(f"{node.name} exited:\n{c.tail(node)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"identities after {timeout:.0f} s: {len(have_id)} of "
                                   f"{len(joiners)}")
            time.sleep(0.02)
        identities_s = max(have_id.values())
        c.wait_converged(max(1.0, deadline - time.monotonic()))
        converged_s = time.time() - t0
        busy1, self1 = machine_busy_s(), proc_cpu_s(os.getpid())
        cluster_cpu = sum(proc_cpu_s(nd.pid) or 0.0 for nd in c.nodes) - seed_cpu0
        other = None
        if busy0 is not None and busy1 is not None and self0 is not None and self1 is not None:
            other = busy1 - busy0 - cluster_cpu - (self1 - self0)
        issued = metric_sum(seed.metrics(), "meshd_security_issued_certificates_total",
                            op="enroll")
        enrolled = {nd.name: _log_time(e) - t0 for nd in joiners for e in nd.events("enrolled")}
        # When each node's table was complete, from its log (its last member_join needed):
        # independent of the polling above.
        complete: dict[str, float] = {}
        for nd in c.nodes:
            first_seen: dict[str, float] = {}
            for e in nd.events("member_join"):
                first_seen.setdefault(e["member"], _log_time(e) - t0)
            if set(c.names) - {nd.name} <= set(first_seen):
                complete[nd.name] = max(first_seen.values())
        started = {nd.name: _log_time(e) - t0 for nd in c.nodes
                   for e in nd.events("agent_started")[:1]}
        retries = sum(len(nd.events("enroll_retry")) for nd in joiners)
        refusals = {f"{k[0]}/{k[1]}": v for k, v in _refusals(seed.metrics()).items()}
        return {"seed_ready_s": seed_ready, "starts_spread_s": t_last_start - t0,
                "identities_s": identities_s, "converged_s": converged_s,
                "first_enrolled_log_s": min(enrolled.values()) if enrolled else None,
                "last_enrolled_log_s": max(enrolled.values()) if enrolled else None,
                "converged_log_s": (max(complete.values()) if len(complete) == n else None),
                "last_complete_node": max(complete, key=lambda k: complete[k]) if complete
                else None,
                "enrolled_logged": len(enrolled),
                "last_agent_started_s": max(v for k, v in started.items() if k != seed.name),
                "issued_enroll": issued, "enroll_retries": retries,
                "cluster_cpu_s": cluster_cpu, "other_processes_cpu_s": other,
                "disturbed": other is not None and other / converged_s > QUIET_CORES,
                "loadavg_before": loadavg_before,
                "seed_refusals": refusals, "token_id": claims.id,
                "identity_s_per_node": dict(sorted(have_id.items(), key=lambda kv: kv[1]))}
    finally:
        c.close()


def _refusals(samples: list[tuple[str, dict[str, str], float]]) -> dict[tuple[str, str], float]:
    return {(lab.get("channel", ""), lab.get("reason", "")): v for name, lab, v in samples
            if name == "meshd_security_refusals_total" and v}


def enroll_bench(runs: int, n: int, keep: bool, settle: float) -> dict[str, Any]:
    out = []
    for k in range(runs):
        quiet = wait_quiet(settle)
        workdir = Path(tempfile.mkdtemp(prefix=f"bench-security-enroll{k}-"))
        print(f"  enroll run {k + 1}/{runs}: {n} processes, logs under {workdir}",
              file=sys.stderr, flush=True)
        try:
            r = enroll_run(workdir, n, 60.0)
            r["before"] = quiet
        finally:
            if not keep:
                shutil.rmtree(workdir, ignore_errors=True)
        print(f"    identities {r['identities_s']:.2f} s, converged {r['converged_s']:.2f} s, "
              f"issued {r['issued_enroll']:.0f}", file=sys.stderr, flush=True)
        out.append(r)
        time.sleep(1.0)  # let the killed processes' sockets go
    return {"nodes": n, "runs": out}


# --- report ----------------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _ms(v: float) -> str:
    return f"{v:.3f} ms"


HEAD = ("metric", "measured", "bar", "verdict")


def build_rows(res: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    if "issue" in res:
        r = res["issue"]
        s = r["issue"]
        rows.append((f"issue: CA.issue(csr, [node]), p50 (p99, mean) of {s['n']:,}",
                     f"{_ms(s['p50_ms'])} ({s['p99_ms']:.3f}, {s['mean_ms']:.3f})",
                     f"p50 <= {ISSUE_BAR_MS:g} ms", _verdict(s["p50_ms"] <= ISSUE_BAR_MS)))
        e = r["enroll_handle"]
        rows.append((f"issue: Authority.handle(enroll), p50 (p99, mean) of {e['n']:,}",
                     f"{_ms(e['p50_ms'])} ({e['p99_ms']:.3f}, {e['mean_ms']:.3f})", "-", ""))
    if "admin" in res:
        r = res["admin"]
        lat = r["latency"]
        base = lat["plaintext/Members"]
        for s in SERVERS:
            x = lat[f"{s}/Members"]
            ratio = r["ratio_p50"][s]
            bar, verdict = "-", ""
            if s == "mtls_audit":
                bar, verdict = f"<= {MTLS_BAR_RATIO:.2f}x", _verdict(ratio <= MTLS_BAR_RATIO)
            rows.append((f"admin Members, {SERVER_LABEL[s]}: p50 (p99), x plaintext p50",
                         f"{_ms(x['p50_ms'])} ({x['p99_ms']:.3f}), "
                         f"{'1.00' if x is base else f'{ratio:.2f}'}x", bar, verdict))
        for s in SERVERS:
            x = lat[f"{s}/Rtt"]
            rows.append((f"admin Rtt (small), {SERVER_LABEL[s]}: p50 (p99), x plaintext",
                         f"{_ms(x['p50_ms'])} ({x['p99_ms']:.3f}), "
                         f"{r['ratio_p50_rtt'][s]:.2f}x", "-", ""))
        for s in SERVERS[2:]:
            x = lat[f"{s}/Whoami"]
            rows.append((f"admin Whoami, {SERVER_LABEL[s]}: p50 (p99)",
                         f"{_ms(x['p50_ms'])} ({x['p99_ms']:.3f})", "-", ""))
        p = r["parts"]
        rows.append(("admin in-process: Members handler alone (no gRPC)",
                     f"{p['members_handler_us']:.0f} us", "-", ""))
        rows.append(("admin in-process: verify_pem cached / audit record file / off",
                     f"{p['verify_pem_cached_us']:.1f} / {p['audit_record_file_us']:.1f} / "
                     f"{p['audit_record_off_us']:.2f} us", "-", ""))
    if "enroll" in res:
        runs = res["enroll"]["runs"]
        n = res["enroll"]["nodes"]

        def spread(key: str) -> str:
            vals = [x[key] for x in runs]
            return f"{statistics.median(vals):.2f} s (max {max(vals):.2f})"

        conv = [x["converged_s"] for x in runs]
        k = len(runs)
        rows.append((f"enroll: {n - 1} joiners have identity/cert.pem, median (max) of {k}",
                     spread("identities_s"), "-", ""))
        rows.append((f"enroll: all {n} see {n} alive (wait_converged), median (max) of {k}",
                     spread("converged_s"), f"<= {CONVERGE_BAR_S:g} s",
                     _verdict(max(conv) <= CONVERGE_BAR_S)))
        rows.append((f"enroll: logs: first / last joiner enrolled, median of {k}",
                     f"{statistics.median(x['first_enrolled_log_s'] for x in runs):.2f} / "
                     f"{statistics.median(x['last_enrolled_log_s'] for x in runs):.2f} s",
                     "-", ""))
        if all(x["converged_log_s"] is not None for x in runs):
            rows.append((f"enroll: logs: last member_join completing a table, median (max) "
                         f"of {k}", spread("converged_log_s"), "-", ""))
        issued = [x["issued_enroll"] for x in runs]
        rows.append(("enroll: certificates n1 issued (op=enroll), per run",
                     ", ".join(f"{v:.0f}" for v in issued), f"= {n - 1}",
                     _verdict(all(v == n - 1 for v in issued))))
    return rows


def build_notes(res: dict[str, Any], quick: bool) -> list[str]:
    notes = []
    if quick:
        notes.append("QUICK run: fewer calls and one cluster run; a smoke check, not the "
                     "numbers.")
    before: list[tuple[str, Any]] = [(k, res[k]["before"]) for k in ("issue", "admin")
                                     if k in res]
    before += [(f"enroll run {i + 1}", r["before"])
               for i, r in enumerate(res.get("enroll", {}).get("runs", []))]
    if before:
        notes.append("The machine is shared: cores other processes used in the 2 s before each "
                     "measurement (after waiting up to --settle s for <= "
                     f"{QUIET_CORES:g}): " + ", ".join(
                         f"{k} {_cores(b.get('other_cores'))}" for k, b in before) + ".")
    if "issue" in res:
        p = res["issue"]["enroll_parts"]
        notes.append(f"issue: the enrollment step checks the CSR twice (Authority._enroll, then "
                     f"CertificateAuthority.issue), {p['check_csr_ms']:.3f} ms each; the token "
                     f"check costs {p['token_check_ms']:.3f} ms (HKDF of the MAC key per "
                     f"call).")
    if "admin" in res:
        r = res["admin"]
        info = r["responses"]
        m = info["mtls_audit/Members"]
        notes.append(f"admin: client in a separate process (grpc sync stubs, one channel per "
                     f"server, {r['setup']['warmup']} warm-up calls each), servers on one "
                     f"grpc.aio event loop in the bench process; {r['setup']['calls']:,} calls "
                     f"per server and method in blocks of {r['setup']['block']}, server order "
                     f"rotated per round.  Members returns {m['members']} rows, "
                     f"{m['response_bytes']:,} bytes.  The audit log got "
                     f"{r['audit_records']:,} records.  CPU over the {r['wall_s']:.1f} s of "
                     f"calls: servers {r['server_process_cpu_s']:.1f} s, client "
                     f"{r['client_cpu_s']:.1f} s, other processes on the machine "
                     f"{_cpu(r.get('other_processes_cpu_s'))}.")
    if "enroll" in res:
        runs = res["enroll"]["runs"]
        retries = [x["enroll_retries"] for x in runs]
        refused = [x["seed_refusals"] for x in runs]
        spread = statistics.median(x["starts_spread_s"] for x in runs)
        seed = statistics.median(x["seed_ready_s"] for x in runs)
        n = res["enroll"]["nodes"]
        notes.append(f"enroll: times from the first of the {n - 1} starts ({n - 1} Popen calls "
                     f"take {spread:.2f} s); n1 answered its admin API {seed:.2f} s after its "
                     f"start; enrollment retries per run {retries}; n1 refusals {refused}.  "
                     f"CPU from the first start to convergence: the cluster "
                     f"{', '.join(_cpu(x['cluster_cpu_s']) for x in runs)} per run, other "
                     f"processes on the machine "
                     f"{', '.join(_cpu(x['other_processes_cpu_s']) for x in runs)}.")
        disturbed = [i + 1 for i, x in enumerate(runs) if x.get("disturbed")]
        if disturbed:
            notes.append(f"enroll: in run(s) {disturbed} other processes used more than "
                         f"{QUIET_CORES:g} cores on average; the agents are CPU-bound while they "
                         f"start (see the CPU above), so such a run can be slower.")
    return notes


def _cores(v: float | None) -> str:
    return "unknown" if v is None else f"{v:.2f}"


def _cpu(v: float | None) -> str:
    return "unknown" if v is None else f"{max(0.0, v):.1f} s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="fewer calls and one cluster run: a smoke check")
    ap.add_argument("--only", default="",
                    help=f"comma-separated sections to (re)run, merged into --out's results "
                         f"({','.join(SECTIONS)})")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "security.json")
    ap.add_argument("--issues", type=int, help="timed issues (2,000; quick 300)")
    ap.add_argument("--calls", type=int, help="admin calls per server and method (3,000; "
                                              "quick 300)")
    ap.add_argument("--warmup", type=int, default=300, help="admin warm-up calls per server")
    ap.add_argument("--block", type=int, default=250, help="admin calls per timed block")
    ap.add_argument("--runs", type=int, help="cluster runs (3; quick 1)")
    ap.add_argument("--nodes", type=int, default=N_NODES, help="cluster size")
    ap.add_argument("--keep-logs", action="store_true", help="keep the agents' logs")
    ap.add_argument("--settle", type=float, help="before each measurement, wait up to this "
                    f"many seconds for other processes to use <= {QUIET_CORES:g} cores "
                    "(300; quick 0)")
    ap.add_argument("--admin-client", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.admin_client:
        json.dump(admin_client(json.loads(args.admin_client)), sys.stdout)
        return 0
    q = args.quick
    args.issues = args.issues or (300 if q else 2000)
    args.calls = args.calls or (300 if q else 3000)
    args.warmup = min(args.warmup, 100) if q else args.warmup
    args.runs = args.runs or (1 if q else 3)
    if args.settle is None:
        args.settle = 0.0 if q else 300.0
    if not 2 <= args.nodes <= 250:
        ap.error("--nodes must be 2..250")
    sections = set(SECTIONS)
    previous: dict[str, Any] = {}
    if args.only:
        sections = set(args.only.split(","))
        if sections - set(SECTIONS):
            ap.error(f"--only: unknown section(s) {sorted(sections - set(SECTIONS))}")
        if args.out.exists():
            previous = json.loads(args.out.read_text()).get("results", {})

    started = time.perf_counter()
    results: dict[str, Any] = dict(previous)
    print(f"security: sections {','.join(s for s in SECTIONS if s in sections)}"
          f"{' (quick)' if q else ''}", file=sys.stderr, flush=True)
    if "issue" in sections:
        quiet = wait_quiet(args.settle)
        results["issue"] = {**issue_bench(args.issues), "before": quiet}
        print("  issue done", file=sys.stderr, flush=True)
    if "admin" in sections:
        quiet = wait_quiet(args.settle)
        results["admin"] = {**admin_bench(args.calls, args.warmup, args.block,
                                          20_000 if not q else 2000), "before": quiet}
        print("  admin done", file=sys.stderr, flush=True)
    if "enroll" in sections:
        results["enroll"] = enroll_bench(args.runs, args.nodes, args.keep_logs, args.settle)
    wall = time.perf_counter() - started

    rows = build_rows(results)
    notes = build_notes(results, q)
    print(f"\nSecurity plane: certificates, mTLS + RBAC on the admin API, enrollment"
          f"{': QUICK sizes' if q else ''} ({os.cpu_count()} CPUs, Python "
          f"{platform.python_version()})\n")
    print_table(HEAD, rows)
    for note in notes:
        print(f"\n* {note}")
    print(f"\nwall time {wall:.0f} s")
    report = {
        "benchmark": "security", "quick": q, "argv": sys.argv,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **machine_info(), "wall_s": wall,
        "setup": {"issues": args.issues, "admin_calls": args.calls,
                  "admin_warmup": args.warmup, "admin_block": args.block,
                  "admin_members": ADMIN_MEMBERS, "cluster_runs": args.runs,
                  "cluster_nodes": args.nodes, "profile": "lan", "settle_s": args.settle,
                  "quiet_other_cores": QUIET_CORES,
                  "bars": {"issue_p50_ms": ISSUE_BAR_MS, "mtls_p50_ratio": MTLS_BAR_RATIO,
                           "converged_s": CONVERGE_BAR_S}},
        "table": [dict(zip(HEAD, r, strict=True)) for r in rows],
        "notes": notes,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 1 if any(r[3] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
