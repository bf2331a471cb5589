"""A cluster of real meshd processes on loopback, for integration tests and benchmarks.

Not a test module: tests build a :class:`Cluster` (usually through a fixture that calls
:meth:`Cluster.close` in its finalizer) and drive it::

    c = Cluster(8, workdir)          # nodes n1..n8 on 127.0.0.2..127.0.0.9 (Linux)
    c.start()                        # seed first, then the rest join it (--retry-join)
    c.wait_converged()               # every node sees every node alive (admin gRPC)
    c.nodes[3].kill()                # kill -9; .stop()/.cont() SIGSTOP/SIGCONT; .terminate()
    c.wait_for(lambda: c.all_see("n4", "dead"), 20, "n4 dead everywhere")

Each node gets its own loopback address and a gossip/admin/metrics port triple starting at a
random base port, checked free by binding before use, so clusters of concurrent tests (and other
sessions on the same machine) do not collide.  With ``netns=NAME`` (see :func:`netns_create`)
every process runs under ``ip netns exec NAME`` and the admin/metrics queries are made by a
small helper process inside the namespace (``python -m testbed.cluster --serve``), since the test
process is outside it.

Children are killed by :meth:`Cluster.close`, at interpreter exit, and (Linux, main thread) by
the kernel if the test process dies (``setpriv --pdeathsig``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from meshd.dev.ports import PORT_LOW, pick_port_blocks
from meshd.dev.processes import kill_at_exit, pdeathsig_prefix

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")

TRUST_DOMAIN = "mesh.test"


class ClusterError(AssertionError):
    """A cluster did not reach the expected state in time (message says what it saw)."""


@dataclass(frozen=True, slots=True)
class MemberView:
    """One row of a node's member table, as its admin API reports it."""

    name: str
    address: str
    status: str
    incarnation: int
    roles: tuple[str, ...] = ()
    zone: str = ""
    tags: tuple[tuple[str, str], ...] = ()
    is_local: bool = False

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemberView:
        return cls(d["name"], d["address"], d["status"], int(d["incarnation"]),
                   tuple(d.get("roles", ())), d.get("zone", ""),
                   tuple(sorted(d.get("tags", {}).items())), bool(d.get("is_local", False)))


def member_to_dict(m: Any) -> dict[str, Any]:
    """An ``admin_pb2.Member`` as a plain dict (what :meth:`MemberView.from_dict` reads)."""
    return {"name": m.name, "address": m.address, "status": m.status,
            "incarnation": m.incarnation, "roles": list(m.roles), "zone": m.zone,
            "tags": dict(m.tags), "is_local": m.is_local}


class RpcFailed(RuntimeError):
    """An admin call failed; ``code`` is the gRPC status code name (e.g. ``UNAVAILABLE``)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


# --- queries: in this process, or from a helper inside a network namespace ------------------


class _LocalClient:
    """Admin gRPC and HTTP from the test process (no network namespace)."""

    def __init__(self, creds: Path) -> None:
        from certs.identity import Identity

        self.identity = Identity.load(creds)
        self._channels: dict[str, Any] = {}
        self._lock = threading.Lock()

    def members(self, target: str, timeout: float, status: Iterable[str] = (),
                role: Iterable[str] = ()) -> list[dict[str, Any]]:
        from proto.mesh.v1 import admin_pb2

        resp = self._call(target, "Members", admin_pb2.MembersRequest(
            status=list(status), role=list(role)), timeout)
        return [member_to_dict(m) for m in resp.members]

    def rtt(self, target: str, a: str, b: str, timeout: float) -> dict[str, Any]:
        """``mesh.v1.Admin/Rtt`` as a dict (proto field names, defaults included)."""
        from google.protobuf.json_format import MessageToDict

        from proto.mesh.v1 import admin_pb2

        resp = self._call(target, "Rtt", admin_pb2.RttRequest(a=a, b=b), timeout)
        return MessageToDict(resp, preserving_proto_field_name=True,
                             always_print_fields_with_no_presence=True)

    def _call(self, target: str, method: str, request: Any, timeout: float) -> Any:
        import grpc

        from certs import tls
        from proto.mesh.v1 import admin_pb2_grpc

        with self._lock:
            channel: Any = self._channels.get(target)
            if channel is None:
                channel = tls.grpc_channel(target, self.identity, options=[
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 500)])
                self._channels[target] = channel
        try:
            return getattr(admin_pb2_grpc.AdminStub(channel), method)(request, timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            if code != grpc.StatusCode.INVALID_ARGUMENT:
                with self._lock:
                    if self._channels.get(target) is channel:
                        del self._channels[target]
                channel.close()
            raise RpcFailed(code.name, exc.details() or "") from None  # type: ignore[attr-defined]

    def http_get(self, url: str, timeout: float) -> str:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - test URL
            return str(r.read().decode())

    def close(self) -> None:
        with self._lock:
            for ch in self._channels.values():
                ch.close()
            self._channels.clear()


class _NetnsClient:
    """The same queries, made by ``python -m testbed.cluster --serve`` inside a namespace."""

    def __init__(self, netns: str, creds: Path) -> None:
        self.proc = subprocess.Popen(
            [*pdeathsig_prefix(), "ip", "netns", "exec", netns, sys.executable, "-m",
             "testbed.cluster", "--serve", str(creds)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            env=_child_env())
        kill_at_exit(self.proc)
        self._lock = threading.Lock()

    def _call(self, req: dict[str, Any]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("netns query helper exited")
        resp = json.loads(line)
        if "error" in resp:
            raise RpcFailed(resp["error"], resp.get("details", ""))
        return resp["result"]

    def members(self, target: str, timeout: float, status: Iterable[str] = (),
                role: Iterable[str] = ()) -> list[dict[str, Any]]:
        return list(self._call({"op": "members", "target": target, "timeout": timeout,
                                "status": list(status), "role": list(role)}))

    def http_get(self, url: str, timeout: float) -> str:
        return str(self._call({"op": "get", "url": url, "timeout": timeout}))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _serve(creds: str) -> int:
    """The helper's loop: one JSON request per stdin line, one JSON answer per stdout line."""
    client = _LocalClient(Path(creds))
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "members":
                out: dict[str, Any] = {"result": client.members(
                    req["target"], req["timeout"], req.get("status", ()), req.get("role", ()))}
            else:
                out = {"result": client.http_get(req["url"], req["timeout"])}
        except RpcFailed as exc:
            out = {"error": exc.code, "details": exc.details}
        except Exception as exc:  # noqa: BLE001 - report anything to the test process
            out = {"error": type(exc).__name__, "details": str(exc)}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
    client.close()
    return 0


# --- child processes' environment -----------------------------------------------------------

def _child_env(extra: dict[str, str] | None = None, root: Path = ROOT) -> dict[str, str]:
    # The caller's own MESHD_* settings must not leak into the cluster's agents.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHD_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


# --- addresses --------------------------------------------------------------------------------


def node_ip(index: int) -> str:
    """Loopback address of node ``index`` (1-based): 127.0.0.2, 127.0.0.3, ... on Linux;
    elsewhere only 127.0.0.1 routes, so every node shares it (on distinct ports)."""
    if not sys.platform.startswith("linux"):
        return "127.0.0.1"
    if not 1 <= index <= 250:
        raise ValueError("node index must be 1..250")
    return f"127.0.0.{index + 1}"


# --- logs and metrics -------------------------------------------------------------------------


def parse_log_lines(text: str) -> list[dict[str, Any]]:
    """JSON log lines (non-JSON lines, e.g. a Python traceback, are kept as ``{"raw": ...}``)."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            out.append({"event": "raw", "raw": line})
            continue
        out.append(obj if isinstance(obj, dict) else {"event": "raw", "raw": line})
    return out


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text exposition as ``(sample name, labels, value)``."""
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, dict(s.labels), float(s.value))
            for fam in text_string_to_metric_families(text) for s in fam.samples]


def metric_sum(samples: list[tuple[str, dict[str, str], float]], name: str,
               **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(v for n, lab, v in samples
               if n == name and all(lab.get(k) == want for k, want in labels.items()))


# --- nodes ------------------------------------------------------------------------------------


class Node:
    """One meshd process (it may be restarted: same name, addresses and data dir)."""

    def __init__(self, cluster: Cluster, index: int, name: str, ip: str, base_port: int,
                 args: list[str], env: dict[str, str]) -> None:
        self.cluster = cluster
        self.index = index
        self.name = name
        self.ip = ip
        self.gossip_port, self.admin_port, self.metrics_port = (base_port, base_port + 1,
                                                                base_port + 2)
        self.score_port, self.router_port = base_port + 3, base_port + 4
        self.router_http_port = base_port + 5
        self.args = list(args)
        self.module = "meshd.cli"
        """What ``python -m`` runs (tests.fake_gpu_agent: the agent over a fake NVML)."""
        self.env = dict(env)
        self.root = ROOT
        """The checkout the node runs (another build's, for a mesh in the middle of an
        upgrade: :mod:`testbed.release`)."""
        self.data_dir = cluster.workdir / name
        self.log_path = cluster.workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopped = False
        self.starts = 0
        self._log_offset = 0

    # addresses
    @property
    def gossip(self) -> str:
        return f"{self.ip}:{self.gossip_port}"

    @property
    def admin(self) -> str:
        return f"{self.ip}:{self.admin_port}"

    @property
    def score(self) -> str:
        return f"{self.ip}:{self.score_port}"

    @property
    def router(self) -> str:
        """The KServe ingress, served when the node has ``--role router``."""
        return f"{self.ip}:{self.router_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.ip}:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def command(self, join: list[str] | None = None) -> list[str]:
        c = self.cluster
        cmd = [sys.executable, "-m", self.module, "--node", self.name, "--bind", self.gossip,
               "--admin", self.admin, "--score", self.score, "--router", self.router,
               "--router-http", f"{self.ip}:{self.router_http_port}",
               "--metrics", f"{self.ip}:{self.metrics_port}" if c.metrics else "off",
               "--profile", c.profile, "--data-dir", str(self.data_dir)]
        for seed in join or []:
            cmd += ["--join", seed]
        cmd += self.args
        if c.netns:
            cmd = ["ip", "netns", "exec", c.netns, *cmd]
        return pdeathsig_prefix() + cmd

    # lifecycle
    def start(self, join: list[str] | None = None) -> Node:
        """Start (or restart) the process; ``join`` defaults to the cluster's seed."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        if join is None:
            join = [] if self.index == 1 else [self.cluster.seed.gossip]
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.provision()
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(self.command(join), cwd=self.root, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=_child_env(self.env, self.root))
        finally:
            log.close()
        kill_at_exit(self.proc)
        self.stopped = False
        self.starts += 1
        return self

    def provision(self) -> None:
        """Give the node a mesh identity signed by the cluster's CA, as an operator would
        with ``meshctl cert issue --kind node`` (unless the cluster tests enrollment)."""
        from certs.identity import Identity
        from certs.spiffe import SpiffeId

        ident_dir = self.data_dir / "identity"
        c = self.cluster
        if c.provision and "--ca-dir" not in self.args and "--join-token" not in self.args \
                and not Identity.exists(ident_dir):
            c.ca.mint(SpiffeId.node(TRUST_DOMAIN, self.name), ["node"]).save(ident_dir)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """``kill -9`` and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stopped = False

    def stop(self) -> None:
        """SIGSTOP: the process is frozen (a hung or CPU-starved node)."""
        self.signal(signal.SIGSTOP)
        self.stopped = True

    def cont(self) -> None:
        self.signal(signal.SIGCONT)
        self.stopped = False

    def terminate(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (graceful leave) and wait for the exit; returns the exit code."""
        if self.proc is None:
            return None
        if self.stopped:
            self.cont()
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait(self, timeout: float) -> int | None:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    # observations
    def members(self, timeout: float = 2.0, status: Iterable[str] = (),
                role: Iterable[str] = ()) -> dict[str, MemberView]:
        """This node's member table via ``mesh.v1.Admin/Members`` (raises :class:`RpcFailed`)."""
        rows = self.cluster.client.members(self.admin, timeout, status, role)
        return {r["name"]: MemberView.from_dict(r) for r in rows}

    def rtt(self, a: str, b: str = "", timeout: float = 2.0) -> dict[str, Any]:
        """This node's RTT estimate between ``a`` and ``b`` (``mesh.v1.Admin/Rtt``)."""
        client = self.cluster.client
        if not isinstance(client, _LocalClient):
            raise NotImplementedError("rtt() is not proxied into network namespaces")
        return client.rtt(self.admin, a, b, timeout)

    def logs(self, all_runs: bool = False) -> list[dict[str, Any]]:
        """Parsed JSON log lines of the current run (or of every run with ``all_runs``)."""
        if not self.log_path.exists():
            return []
        with open(self.log_path, "rb") as fh:
            if not all_runs:
                fh.seek(self._log_offset)
            return parse_log_lines(fh.read().decode(errors="replace"))

    def events(self, event: str, all_runs: bool = False) -> list[dict[str, Any]]:
        return [e for e in self.logs(all_runs) if e.get("event") == event]

    def metrics(self, timeout: float = 2.0) -> list[tuple[str, dict[str, str], float]]:
        return parse_metrics(self.cluster.client.http_get(self.metrics_url, timeout))

    def __repr__(self) -> str:
        state = "stopped" if self.stopped else "running" if self.running else "exited"
        return f"<Node {self.name} {self.gossip} {state}>"


class Cluster:
    """``n`` meshd nodes ``n1..nN`` on ``127.0.0.2..127.0.0.(N+1)``; ``n1`` is the seed.

    ``node_args(i)`` adds flags to node ``i`` (1-based), ``node_env(i)`` environment variables
    (e.g. ``MESHD_ENCRYPT``; ``encrypt`` sets it for every node).  Nodes can be added later
    with :meth:`add_node`.
    """

    def __init__(self, n: int, workdir: str | Path, *, profile: str = "lan",
                 encrypt: str | None = None, netns: str | None = None, metrics: bool = True,
                 node_args: Callable[[int], list[str]] | None = None,
                 node_env: Callable[[int], dict[str, str]] | None = None,
                 retry_join: bool = True, spare: int = 0, provision: bool = True) -> None:
        from certs.ca import CertificateAuthority
        from certs.spiffe import SpiffeId

        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ca_dir = self.workdir / "ca"
        if CertificateAuthority.exists(self.ca_dir):
            self.ca = CertificateAuthority.load(self.ca_dir)
        else:
            self.ca = CertificateAuthority.create(TRUST_DOMAIN)
            self.ca.save(self.ca_dir)
        self.provision = provision
        self.admin_creds = self.workdir / "meshctl"
        self.ca.mint(SpiffeId(TRUST_DOMAIN, "user", "test-admin"), ["admin"]).save(
            self.admin_creds)
        self.profile = profile
        self.encrypt = encrypt
        self.netns = netns
        self.metrics = metrics
        self.retry_join = retry_join
        self._node_args = node_args or (lambda i: [])
        self._node_env = node_env or (lambda i: {})
        # Reserve ports for ``spare`` extra nodes so add_node() never collides.
        total = n + spare
        ips = [node_ip(i) for i in range(1, total + 1)]
        self._bases = (pick_port_blocks(ips) if not netns  # a fresh namespace has nothing bound
                       else [PORT_LOW + 5 * i for i in range(total)])
        self.nodes: list[Node] = []
        for _ in range(n):
            self._make_node()
        self.client: _LocalClient | _NetnsClient = (
            _NetnsClient(netns, self.admin_creds) if netns else _LocalClient(self.admin_creds))
        self._closed = False

    def _make_node(self, args: list[str] | None = None,
                   env: dict[str, str] | None = None) -> Node:
        i = len(self.nodes) + 1
        if i > len(self._bases):
            raise RuntimeError("no reserved ports left: pass spare= to Cluster")
        node_env = {"MESHD_ENCRYPT": self.encrypt} if self.encrypt else {}
        node_env.update(self._node_env(i))
        node_env.update(env or {})
        node_args = self._node_args(i) + (args or [])
        if self.retry_join and i > 1 and "--retry-join" not in node_args:
            node_args.append("--retry-join")
        node = Node(self, i, f"n{i}", node_ip(i), self._bases[i - 1], node_args, node_env)
        self.nodes.append(node)
        return node

    def add_node(self, args: list[str] | None = None, env: dict[str, str] | None = None,
                 retry_join: bool | None = None) -> Node:
        """A new (not yet started) node; ``retry_join=False`` makes a failed join fatal."""
        node = self._make_node(args, env)
        if retry_join is False and "--retry-join" in node.args:
            node.args.remove("--retry-join")
        return node

    @property
    def seed(self) -> Node:
        return self.nodes[0]

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def live_nodes(self) -> list[Node]:
        """Nodes whose process runs and is not SIGSTOPped."""
        return [n for n in self.nodes if n.running and not n.stopped]

    # lifecycle
    def start(self, timeout: float = 20.0) -> Cluster:
        """Start the seed, wait until it serves, then start every other node at once."""
        self.seed.start()
        self.wait_for(lambda: self._serving(self.seed), timeout, f"seed {self.seed.name} up")
        for n in self.nodes[1:]:
            n.start()
        return self

    def _serving(self, node: Node) -> bool:
        if not node.running:
            raise ClusterError(f"{node.name} exited with {node.proc and node.proc.returncode}:"
                               f"\n{self.tail(node)}")
        try:
            node.members(timeout=1.0)
        except RpcFailed:
            return False
        return True

    def close(self) -> None:
        """Kill every process (SIGKILL works on stopped ones too) and the query helper."""
        if self._closed:
            return
        self._closed = True
        for n in self.nodes:
            with contextlib.suppress(Exception):
                n.kill()
        with contextlib.suppress(Exception):
            self.client.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # observations
    def views(self, nodes: Iterable[Node] | None = None,
              timeout: float = 2.0) -> dict[str, dict[str, MemberView]]:
        """``{node: {member: view}}`` for every live node (or ``nodes``) that answers."""
        out: dict[str, dict[str, MemberView]] = {}
        for n in nodes if nodes is not None else self.live_nodes():
            with contextlib.suppress(RpcFailed):
                out[n.name] = n.members(timeout=timeout)
        return out

    def all_see(self, member: str, status: str, observers: Iterable[Node] | None = None,
                min_incarnation: int | None = None) -> bool:
        """True when every observer (default: every other live node) answers and reports
        ``member`` with ``status`` (and at least ``min_incarnation``)."""
        obs = [n for n in (observers if observers is not None else self.live_nodes())
               if n.name != member or observers is not None]
        views = self.views(obs)
        if len(views) < len(obs):
            return False
        for view in views.values():
            m = view.get(member)
            if m is None or m.status != status:
                return False
            if min_incarnation is not None and m.incarnation < min_incarnation:
                return False
        return True

    def converged(self, names: Iterable[str] | None = None,
                  observers: Iterable[Node] | None = None) -> bool:
        """Every observer answers and sees exactly ``names`` (default: all nodes) alive."""
        want = set(names if names is not None else self.names)
        obs = list(observers if observers is not None else
                   [n for n in self.nodes if n.name in want])
        views = self.views(obs)
        if len(views) < len(obs):
            return False
        return all({m.name for m in v.values() if m.status == "alive"} == want
                   for v in views.values())

    def wait_converged(self, timeout: float = 30.0, names: Iterable[str] | None = None) -> float:
        """Wait until :meth:`converged`; returns the seconds it took."""
        names = list(names) if names is not None else None
        t0 = time.monotonic()
        self.wait_for(lambda: self.converged(names), timeout, "convergence",
                      on_timeout=self.describe)
        return time.monotonic() - t0

    def wait_for(self, predicate: Callable[[], T], timeout: float, what: str,
                 interval: float = 0.1, on_timeout: Callable[[], str] | None = None) -> T:
        """Poll ``predicate`` until it returns a true value (returned) or ``timeout`` passes.

        A node that exits unexpectedly fails at once; on timeout the message includes every
        node's member table (or ``on_timeout()``)."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                detail = on_timeout() if on_timeout else self.describe()
                raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}\n{detail}")
            time.sleep(interval)

    def describe(self) -> str:
        """Every live node's member table, for failure messages."""
        lines = []
        for node, view in sorted(self.views().items()):
            row = ", ".join(f"{m.name}={m.status}/{m.incarnation}" for m in view.values())
            lines.append(f"  {node}: {row}")
        for n in self.nodes:
            if n.proc is not None and not n.running:
                lines.append(f"  {n.name}: exited {n.proc.returncode}")
        return "\n".join(lines) or "  (no node answered)"

    def tail(self, node: Node, lines: int = 20) -> str:
        if not node.log_path.exists():
            return ""
        return "\n".join(node.log_path.read_text(errors="replace").splitlines()[-lines:])

    def events(self, event: str, all_runs: bool = True) -> list[dict[str, Any]]:
        """Every node's log records with ``event`` (e.g. ``member_failed``)."""
        return [e for n in self.nodes for e in n.events(event, all_runs)]


# --- network namespaces -----------------------------------------------------------------------


def netns_unavailable() -> str | None:
    """Why a network namespace with iptables packet loss cannot be used here (None if it can)."""
    import shutil

    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces and iptables need root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (apt-get install iproute2 iptables)"
    return None


def netns_create(prefix: str = "meshd-test") -> str:
    """A fresh network namespace with ``lo`` up (raises ``RuntimeError`` saying why not)."""
    name = f"{prefix}-{os.getpid()}-{random.randrange(1 << 30):x}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip netns add failed: {r.stderr.strip()}")
    r = subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], capture_output=True,
                       text=True)
    if r.returncode != 0:
        netns_delete(name)
        raise RuntimeError(f"cannot bring lo up in {name}: {r.stderr.strip()}")
    return name


def netns_delete(name: str) -> None:
    subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def netns_exec(name: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", name, *cmd], check=check, capture_output=True,
                          text=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        sys.exit(_serve(sys.argv[2]))
    print("usage: python -m testbed.cluster --serve CREDS_DIR  (query helper for network "
          "namespaces)", file=sys.stderr)
    sys.exit(2)
