"""Serving must not delay the control plane: a router node saturated by normal load and fed
oversized and malformed requests, and what its mesh sees of it - suspicions of it, admin API
latency, its memory - before, during and after; the default (the router in a worker
process) against the agent serving the router itself (``--router-workers 0``), in one run.

    ./dev bench overload [--quick] [--before 20] [--during 60] [--after 20] [--configs ...]
    .venv/bin/python bench/overload.py ...

**The mesh** (per configuration, a fresh one): three real meshd agents
(``testbed/cluster.py``, LAN profile, mTLS, ``--gpu off``), all coordinators (Raft groups
``policy`` and ``placements``, ``--bootstrap-expect 3``).  ``n1`` is the router node
(``--role router --subscribe '*'``); ``n2`` polls one real Triton server
(``meshd.dev.triton``, ``add_sub``).  Configurations (``--configs``):

* ``workers``: the default - one router worker process serves the router's ports; the agent
  serves its score link;
* ``agent``: ``--router-workers 0`` - the agent serves the router in its own event loop, as
  before workers were the default;
* ``workers-nice0`` (not run unless named): ``--router-nice 0`` - workers at the agent's CPU
  priority, as before the default niceness of 5.

Both have the same receive limits (64 MiB of payload + 1 MiB) and the same in-flight budget
(``--router-inflight-mib``, default 256).

**Phases**: ``--before`` s of light normal load (2 callers, 20 ms apart), ``--during`` s of
saturation, ``--after`` s of light load again.  During: normal load from ``--callers``
closed-loop callers (``add_sub``, [1, 16] FP32, prebuilt ``ModelInferRequest`` bytes over
gRPC, mTLS) and ``--abusers`` callers cycling through the abusive kinds:

* ``at_limit``: a ``ModelInferRequest`` of 64 MiB - 1 KiB tensor data for ``add_sub``
  (received, parsed, refused by validation: INVALID_ARGUMENT);
* ``over_limit``: 66 MiB (refused by gRPC as its length prefix arrives: RESOURCE_EXHAUSTED);
* ``far_over``: 200 MiB (likewise), and once at the start of the phase, alone,
  ``--huge-mib`` (900, the size that took a node out of the mesh);
* ``random``: 32 MiB of random bytes (not a message: INVALID_ARGUMENT);
* ``bomb``: 32 MiB of empty ``inputs`` entries (16 M fields, about 1.4 GB once parsed;
  refused before parsing: INVALID_ARGUMENT);
* ``http_over``: an HTTPS body of 70 MiB (413);
* ``http_json``: 16 MiB of JSON that is not a request (400).

The load generators (child processes of this script) and Triton run at ``nice 10``: on a
2-core machine they would otherwise take the CPU the router node's processes need, which
clients and GPU servers on other machines would not; the agents (and the router's workers)
run at the normal priority.

**Measured**, throughout: ``Admin.Members`` on ``n1`` every 50 ms (mTLS, from a child
process): p50, p99, max per phase; the router node's RSS (the agent and its workers, from
/proc every 0.5 s): at the end of each phase and its peak; its CPU (cores, agent and
workers); suspicions of ``n1`` (``member_suspect``/``member_failed`` events about it in the
other agents' logs, and ``n1``'s refutations); Raft elections (term increases of either
group); the normal requests' outcomes and latency; the abusive requests' outcomes by kind.

**Bars** (issue 27, item 1), for the default configuration: no suspicion of the router node
during or after; admin p99 during and after within 2x its p99 before; RSS bounded: the node's
peak during within its RSS before + 4 x the in-flight budget per worker (a request weighs
about twice its bytes: what is parsed and relayed is held beside the message) + the huge
request (gRPC receives a whole message before it checks its size: measured with grpcio
1.81, a 900 MiB message is all read, then refused), and its RSS at the end of ``after``
within its RSS before + 128 MiB.  The ``agent`` configuration runs beside it, without a bar.

Prints the tables and writes ``bench/results/overload.{json,md}`` (``--out``).  ``--quick``
(10/20/10 s) is a smoke check and says so.  The machine is shared (2 cores): load averages and
the CPU others used are recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import ssl
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder comes first on sys.path and a bench module could shadow
# a package of the project: put the project root first instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench import child  # noqa: E402
from bench.child import log  # noqa: E402
from bench.table import (  # noqa: E402
    Others,
    distribution,
    format_table,
    loadavg,
    proc_cpu_s,
    publish,
    verdict,
)

INFER = "/inference.GRPCInferenceService/ModelInfer"
MODEL = "add_sub"
WIDTH = 16
PHASES = ("before", "during", "after")
CONFIGS = {"workers": [], "agent": ["--router-workers", "0"],
           "workers-nice0": ["--router-nice", "0"], "workers-nice19": ["--router-nice", "19"]}
CONFIG_LABEL = {"workers": "workers (default)", "agent": "agent (--router-workers 0)",
                "workers-nice0": "workers at the agent's priority (--router-nice 0)",
                "workers-nice19": "workers at the lowest priority (--router-nice 19)"}
KINDS = ("at_limit", "over_limit", "far_over", "random", "bomb", "http_over", "http_json")
ADMIN_EVERY = 0.05
SAMPLE_EVERY = 0.5
ADMIN_P99_RATIO = 2.0
RSS_AFTER_MIB = 128
RSS_BUDGET_FACTOR = 4
OTHERS_NICE = 10
"""The priority of what would run on other machines: the load generators and Triton."""


# --- child processes ----------------------------------------------------------------------------


def _creds(d: Path) -> tuple[bytes, bytes, bytes]:
    return ((d / "bundle.pem").read_bytes(), (d / "key.pem").read_bytes(),
            (d / "cert.pem").read_bytes())


def _channel(target: str, creds: Path) -> Any:
    import grpc

    from certs.spiffe import any_node_dns
    from testbed.cluster import TRUST_DOMAIN

    root, key, chain = _creds(creds)
    return grpc.aio.secure_channel(
        target, grpc.ssl_channel_credentials(root, key, chain),
        options=[("grpc.ssl_target_name_override", any_node_dns(TRUST_DOMAIN)),
                 ("grpc.max_send_message_length", -1), ("grpc.use_local_subchannel_pool", 1)])


def _add_sub() -> bytes:
    import numpy as np
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name=MODEL)
    for name in ("INPUT0", "INPUT1"):
        req.inputs.add(name=name, datatype="FP32", shape=[1, WIDTH])
        req.raw_input_contents.append(np.arange(WIDTH, dtype=np.float32).tobytes())
    return req.SerializeToString()


class _Commands:
    """Commands from stdin (one per line), for an asyncio child: each answered with one JSON
    line by ``handle`` on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, handle: Any) -> None:
        self.loop = loop
        self.handle = handle
        self.done = asyncio.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            cmd, _, arg = line.strip().partition(" ")
            fut = asyncio.run_coroutine_threadsafe(self._one(cmd, arg), self.loop)
            print(json.dumps(fut.result(), default=str), flush=True)
            if cmd == "stop":
                break
        self.loop.call_soon_threadsafe(self.done.set)

    async def _one(self, cmd: str, arg: str) -> Any:
        try:
            return await self.handle(cmd, arg)
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            return {"error": f"{type(exc).__name__}: {exc}"}


async def _load_child(spec: dict[str, Any]) -> int:
    """Normal load: ``mode light`` (2 callers, 20 ms apart), ``mode full`` (``callers``
    closed-loop), ``mode off``; ``take`` answers and resets the samples
    ``[[t, seconds, code], ...]``."""
    import grpc

    os.nice(OTHERS_NICE)
    loop = asyncio.get_running_loop()
    ch = _channel(spec["target"], Path(spec["creds"]))
    call = ch.unary_unary(INFER)
    body = _add_sub()
    mode = ["off"]
    samples: list[list[Any]] = []

    async def caller(i: int) -> None:
        while True:
            m = mode[0]
            if m == "off" or (m == "light" and i >= 2):
                await asyncio.sleep(0.05)
                continue
            t0 = time.perf_counter()
            try:
                await call(body, timeout=10)
                code = "OK"
            except grpc.aio.AioRpcError as exc:
                code = exc.code().name
            samples.append([time.time(), time.perf_counter() - t0, code])
            if m == "light":
                await asyncio.sleep(0.02)

    tasks = [asyncio.create_task(caller(i)) for i in range(max(2, int(spec["callers"])))]

    async def handle(cmd: str, arg: str) -> Any:
        if cmd == "mode":
            mode[0] = arg
            return {"ok": True}
        if cmd == "take":
            out = list(samples)
            samples.clear()
            return {"samples": out}
        if cmd == "stop":
            mode[0] = "off"
            return {"ok": True}
        return {"error": f"unknown command {cmd!r}"}
    commands = _Commands(loop, handle)
    print(json.dumps({"pid": os.getpid()}), flush=True)
    await commands.done.wait()
    for t in tasks:
        t.cancel()
    await ch.close()
    return 0


def _payloads(huge_mib: int) -> dict[str, bytes]:
    from tritonclient.grpc import service_pb2

    def infer(size: int) -> bytes:
        req = service_pb2.ModelInferRequest(model_name=MODEL)
        for name in ("INPUT0", "INPUT1"):
            req.inputs.add(name=name, datatype="FP32", shape=[1, WIDTH])
        req.raw_input_contents.append(b"\0" * size)
        return req.SerializeToString()
    out = {"at_limit": infer((64 << 20) - 1024), "over_limit": infer(66 << 20),
           "far_over": infer(200 << 20), "random": os.urandom(32 << 20),
           "bomb": service_pb2.ModelInferRequest(model_name=MODEL).SerializeToString()
           + b"\x2a\x00" * (16 << 20),
           "http_over": b"\0" * (70 << 20), "http_json": b"[" * (16 << 20)}
    if huge_mib:
        out["huge"] = infer(huge_mib << 20)
    return out


async def _abuse_child(spec: dict[str, Any]) -> int:
    """Abusive requests: ``start`` (the ``huge`` one once, then ``abusers`` callers cycling
    through the kinds), ``pause``; ``take`` answers and resets the counts by kind and
    outcome."""
    import aiohttp
    import grpc

    os.nice(OTHERS_NICE)
    loop = asyncio.get_running_loop()
    creds = Path(spec["creds"])
    ch = _channel(spec["target"], creds)
    call = ch.unary_unary(INFER)
    ctx = ssl.create_default_context(cafile=str(creds / "bundle.pem"))
    ctx.check_hostname = False  # the node's certificate names its node, not 127.0.0.x
    ctx.load_cert_chain(str(creds / "cert.pem"), str(creds / "key.pem"))
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx))
    url = f"https://{spec['http']}/v2/models/{MODEL}/infer"
    payloads = _payloads(int(spec["huge_mib"]))
    counts: dict[str, dict[str, int]] = {}
    running = asyncio.Event()

    def count(kind: str, outcome: str) -> None:
        k = counts.setdefault(kind, {})
        k[outcome] = k.get(outcome, 0) + 1

    async def send(kind: str) -> None:
        try:
            if kind.startswith("http_"):
                async with session.post(url, data=payloads[kind], timeout=aiohttp.ClientTimeout(
                        total=30)) as r:
                    await r.read()
                    count(kind, str(r.status))
            else:
                await call(payloads[kind], timeout=30)
                count(kind, "OK")
        except grpc.aio.AioRpcError as exc:
            count(kind, exc.code().name)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            count(kind, type(exc).__name__)

    async def abuser(i: int) -> None:
        n = i
        while True:
            await running.wait()
            await send(KINDS[n % len(KINDS)])
            n += 1

    tasks = [asyncio.create_task(abuser(i)) for i in range(int(spec["abusers"]))]

    async def handle(cmd: str, arg: str) -> Any:
        if cmd == "start":
            async def begin() -> None:
                if "huge" in payloads:  # alone first: its bytes are in transfer at once
                    await send("huge")
                running.set()
            tasks.append(asyncio.create_task(begin()))
            return {"ok": True}
        if cmd == "pause":
            running.clear()
            return {"ok": True}
        if cmd == "take":
            out = {k: dict(v) for k, v in counts.items()}
            counts.clear()
            return {"counts": out}
        if cmd == "stop":
            running.clear()
            return {"ok": True}
        return {"error": f"unknown command {cmd!r}"}
    commands = _Commands(loop, handle)
    print(json.dumps({"pid": os.getpid()}), flush=True)
    await commands.done.wait()
    for t in tasks:
        t.cancel()
    await session.close()
    await ch.close()
    return 0


async def _probe_child(spec: dict[str, Any]) -> int:
    """``Admin.Members`` on the router node every ``ADMIN_EVERY`` s (each call's time from
    its start, in a thread of its own so a slow answer delays no other sample's start more
    than itself); ``take`` answers and resets ``[[t, seconds, ok], ...]``."""
    import grpc

    from certs import tls
    from certs.identity import Identity
    from proto.mesh.v1 import admin_pb2, admin_pb2_grpc

    loop = asyncio.get_running_loop()
    stub = admin_pb2_grpc.AdminStub(tls.grpc_channel(spec["admin"],
                                                     Identity.load(Path(spec["creds"]))))
    samples: list[list[Any]] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            ok = True
            try:
                stub.Members(admin_pb2.MembersRequest(), timeout=10)
            except grpc.RpcError:
                ok = False
            samples.append([time.time(), time.perf_counter() - t0, ok])
            stop.wait(max(0.0, ADMIN_EVERY - (time.perf_counter() - t0)))

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()

    async def handle(cmd: str, arg: str) -> Any:
        if cmd == "take":
            out = list(samples)
            samples.clear()
            return {"samples": out}
        if cmd == "stop":
            stop.set()
            return {"ok": True}
        return {"error": f"unknown command {cmd!r}"}
    commands = _Commands(loop, handle)
    print(json.dumps({"pid": os.getpid()}), flush=True)
    await commands.done.wait()
    stop.set()
    thread.join(15)
    return 0


CHILDREN = {"load": _load_child, "abuse": _abuse_child, "probe": _probe_child}


# --- the router node's processes ----------------------------------------------------------------


def _renice(pids: list[int], nice: int) -> None:
    """Every thread of ``pids`` to ``nice`` (Linux: a thread's priority is its own)."""
    for pid in pids:
        try:
            tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, tid, nice)


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _workers(agent: int) -> list[int]:
    """The router worker processes the agent ``agent`` started."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == agent and b"meshd.router.worker" in (entry / "cmdline").read_bytes():
                out.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


class Sampler:
    """The router node's RSS and CPU (agent, workers) every ``SAMPLE_EVERY`` s, in a
    thread: ``[t, agent RSS MiB, workers' RSS MiB, agent CPU s, workers' CPU s (every
    life so far)]``."""

    def __init__(self, agent: int) -> None:
        self.agent = agent
        self.samples: list[list[float]] = []
        self.dead_cpu = 0.0
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(SAMPLE_EVERY)

    def sample(self) -> None:
        workers = _workers(self.agent)
        cpu: dict[int, float] = {}
        for pid in workers:
            c = proc_cpu_s(pid)
            if c is not None:
                cpu[pid] = c
        for pid, c in self._last.items():  # a worker gone: its CPU stays counted
            if pid not in cpu:
                self.dead_cpu += c
        self._last = cpu
        self.samples.append([time.time(), _rss_mib(self.agent) or 0.0,
                             sum(_rss_mib(p) or 0.0 for p in workers),
                             proc_cpu_s(self.agent) or 0.0, self.dead_cpu + sum(cpu.values())])

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)
        self.sample()


# --- one configuration --------------------------------------------------------------------------


def _ts(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["ts"]).replace("Z", "+00:00")).timestamp()


def _phase_of(t: float, marks: dict[str, float]) -> str | None:
    for p, nxt in zip(PHASES, (*PHASES[1:], "end"), strict=True):
        if marks[p] <= t < marks[nxt]:
            return p
    return None


def _sheds(node: Any) -> dict[str, float]:
    """The router's and the scorer's shed requests by reason, on ``node``."""
    out: dict[str, float] = {}
    with contextlib.suppress(Exception):
        for name, lab, v in node.metrics():
            if name in ("meshd_router_shed_requests_total", "meshd_router_failed_requests_total"):
                key = ("shed " if "shed" in name else "failed ") + lab.get("reason", "")
                out[key] = out.get(key, 0.0) + v
    return out


def _raft_terms(nodes: list[Any]) -> dict[str, float]:
    terms: dict[str, float] = {}
    for n in nodes:
        with contextlib.suppress(Exception):
            for name, lab, v in n.metrics():
                if name == "meshd_raft_term":
                    g = lab.get("group", "")
                    terms[g] = max(terms.get(g, 0.0), v)
    return terms


def run_config(args: argparse.Namespace, name: str, triton: Any, workdir: Path
               ) -> dict[str, Any]:
    from testbed.cluster import Cluster, metric_sum, node_ip
    from testbed.raft import coordinator_args, pick_raft_port

    raft_port = pick_raft_port([node_ip(i) for i in range(1, 4)])
    common = ["--gpu", "off", "--router-inflight-mib", str(args.inflight_mib)]
    roles = {1: ["--role", "router", "--subscribe", "*", *CONFIGS[name]],
             2: ["--role", "gpu", "--triton", triton.meshd_spec], 3: []}
    cluster = Cluster(3, workdir / name, node_args=lambda i: [
        *coordinator_args(i, raft_port, 3), *common, *roles[i]])
    children: dict[str, child.Child] = {}
    sampler: Sampler | None = None
    try:
        cluster.start()
        cluster.wait_converged(60)
        n1 = cluster.seed
        others = cluster.nodes[1:]
        deadline = time.monotonic() + 60
        while not all(v for v in _raft_terms(cluster.nodes).values()) or \
                len(_raft_terms(cluster.nodes)) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the Raft groups never formed")
            time.sleep(0.5)
        creds = str(cluster.admin_creds)
        spec = {"target": n1.router, "http": f"{n1.ip}:{n1.router_http_port}",
                "admin": n1.admin, "creds": creds, "callers": args.callers,
                "abusers": args.abusers, "huge_mib": args.huge_mib}
        for kind in CHILDREN:
            children[kind] = child.Child(__file__, kind, spec, workdir / f"{name}-{kind}.log")
        load = children["load"]
        load.cmd("mode light")
        deadline = time.monotonic() + 90
        while True:  # until the router routes add_sub (the replica reached its view)
            time.sleep(1.0)
            got = load.cmd("take")["samples"]
            if any(code == "OK" for _, _, code in got):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the router never routed {MODEL}: {got[-3:]}")
        log(f"{name}: mesh up, router routing; workers {_workers(n1.pid)}")
        time.sleep(2.0)
        for kind in ("load", "probe"):
            children[kind].cmd("take")
        sampler = Sampler(n1.pid)
        refutes0 = metric_sum(n1.metrics(), "meshd_gossip_refutations_total")
        marks: dict[str, float] = {}
        terms: dict[str, dict[str, float]] = {}
        sheds: dict[str, dict[str, float]] = {}

        def ours() -> float:
            """CPU of the mesh, Triton, the load generators and this process."""
            pids = [n.pid for n in cluster.nodes if n.proc is not None]
            pids += _workers(n1.pid) + [c.pid for c in children.values()]
            pids += list(triton.child_pids())
            t = os.times()
            return t.user + t.system + sum(proc_cpu_s(p) or 0.0 for p in pids)
        watch = Others(ours)
        for phase, seconds in (("before", args.before), ("during", args.during),
                               ("after", args.after)):
            terms[phase] = _raft_terms(cluster.nodes)
            sheds[phase] = _sheds(n1)
            marks[phase] = time.time()
            if phase == "during":
                load.cmd("mode full")
                children["abuse"].cmd("start")
            elif phase == "after":
                children["abuse"].cmd("pause")
                load.cmd("mode light")
            log(f"{name}: {phase} ({seconds:.0f} s)")
            time.sleep(seconds)
        marks["end"] = time.time()
        terms["end"] = _raft_terms(cluster.nodes)
        time.sleep(1.5)  # the workers' last counter reports
        sheds["end"] = _sheds(n1)
        sampler.stop()
        machine = watch.done()
        admin = children["probe"].cmd("take")["samples"]
        normal = load.cmd("take")["samples"]
        abuse = children["abuse"].cmd("take")["counts"]
        refutes = metric_sum(n1.metrics(), "meshd_gossip_refutations_total") - refutes0
        suspicions = [(_ts(e), o.name, e["event"]) for o in others
                      for e in o.events("member_suspect") + o.events("member_failed")
                      if e.get("member") == n1.name]
        out: dict[str, Any] = {"config": name, "flags": CONFIGS[name], "marks": marks,
                               "machine": machine, "refutations": refutes,
                               "abuse": abuse, "phases": {}}
        for p in PHASES:
            t0, t1 = marks[p], marks[PHASES[PHASES.index(p) + 1]] if p != "after" \
                else marks["end"]
            lat = [s for t, s, ok in admin if t0 <= t < t1 and ok]
            errs = sum(1 for t, _, ok in admin if t0 <= t < t1 and not ok)
            samples = [s for s in sampler.samples if t0 <= s[0] <= t1]
            first, last = samples[0], samples[-1]
            wall = max(1e-9, last[0] - first[0])
            reqs = [(s, code) for t, s, code in normal if t0 <= t < t1]
            codes: dict[str, int] = {}
            for _, code in reqs:
                codes[code] = codes.get(code, 0) + 1
            nxt = PHASES[PHASES.index(p) + 1] if p != "after" else "end"
            out["phases"][p] = {
                "admin_ms": distribution([x * 1000 for x in lat]), "admin_errors": errs,
                "suspicions": [s for s in suspicions if _phase_of(s[0], marks) == p],
                "rss_mib_end": {"agent": last[1], "workers": last[2], "node": last[1] + last[2]},
                "rss_mib_peak": {"agent": max(s[1] for s in samples),
                                 "workers": max(s[2] for s in samples),
                                 "node": max(s[1] + s[2] for s in samples)},
                "cores": {"agent": (last[3] - first[3]) / wall,
                          "workers": (last[4] - first[4]) / wall},
                "normal": {"codes": codes, "per_s": len(reqs) / max(1e-9, t1 - t0),
                           "latency_ms": distribution([s * 1000 for s, c in reqs
                                                       if c == "OK"])},
                "raft_elections": sum(max(0.0, terms[nxt].get(g, 0.0) - v)
                                      for g, v in terms[p].items()),
                "router_refused": {k: v - sheds[p].get(k, 0.0) for k, v in sheds[nxt].items()
                                   if v - sheds[p].get(k, 0.0) > 0},
            }
        out["workers"] = 0 if "--router-workers" in CONFIGS[name] else 1
        return out
    finally:
        if sampler is not None:
            sampler.stop()
        for c in children.values():
            with contextlib.suppress(Exception):
                c.stop()
        cluster.close()


# --- the report ---------------------------------------------------------------------------------


def bars(res: dict[str, Any], inflight_mib: int, huge_mib: int
         ) -> dict[str, tuple[bool, str]]:
    """The issue's bars for one configuration: name -> (met, what was measured)."""
    ph = res["phases"]
    susp = len(ph["during"]["suspicions"]) + len(ph["after"]["suspicions"])
    p99 = {p: ph[p]["admin_ms"].get("p99", float("inf")) for p in PHASES}
    ratio = max(p99["during"], p99["after"]) / max(p99["before"], 1e-9)
    before = ph["before"]["rss_mib_end"]["node"]
    peak = ph["during"]["rss_mib_peak"]["node"]
    bound = before + RSS_BUDGET_FACTOR * inflight_mib * max(1, res["workers"]) + huge_mib
    end = ph["after"]["rss_mib_end"]["node"]
    errors = sum(ph[p]["admin_errors"] for p in PHASES)
    return {
        "suspicions": (susp == 0 and res["refutations"] == 0,
                       f"{susp} (refuted by it: {res['refutations']:.0f})"),
        "admin_p99": (ratio <= ADMIN_P99_RATIO and errors == 0,
                      f"{ratio:.2f}x (before {p99['before']:.1f} ms, during "
                      f"{p99['during']:.1f}, after {p99['after']:.1f}; {errors} failed)"),
        "rss_peak": (peak <= bound, f"{peak:.0f} MiB (before {before:.0f}; bound "
                                    f"{bound:.0f})"),
        "rss_after": (end <= before + RSS_AFTER_MIB,
                      f"{end:.0f} MiB (before {before:.0f}; bound +{RSS_AFTER_MIB})"),
    }


BAR_TEXT = {"suspicions": ("suspicions of the router node, during + after", "0"),
            "admin_p99": ("admin p99, during and after / before", "<= 2x, none failed"),
            "rss_peak": ("router node RSS, peak during",
                         "<= before + 4x budget/worker + the huge one"),
            "rss_after": ("router node RSS, end of after", f"<= before + {RSS_AFTER_MIB} MiB")}


def phase_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name, res in results.items():
        for p in PHASES:
            e = res["phases"][p]
            a = e["admin_ms"]
            n = e["normal"]
            ok = n["codes"].get("OK", 0)
            bad = sum(v for k, v in n["codes"].items() if k != "OK")
            rows.append([
                CONFIG_LABEL[name] if p == "before" else "", p,
                f"{len(e['suspicions'])}",
                f"{a.get('p50', 0):.1f} / {a.get('p99', 0):.1f} / {a.get('max', 0):.1f}"
                + (f" ({e['admin_errors']} failed)" if e["admin_errors"] else ""),
                f"{e['rss_mib_end']['agent']:.0f} + {e['rss_mib_end']['workers']:.0f}; "
                f"peak {e['rss_mib_peak']['node']:.0f}",
                f"{e['cores']['agent']:.2f} + {e['cores']['workers']:.2f}",
                f"{ok} ok, {bad} failed; {n['per_s']:.0f}/s; p99 "
                f"{n['latency_ms'].get('p99', 0):.1f} ms",
                ", ".join(f"{k} {v:.0f}" for k, v in sorted(e["router_refused"].items()))
                or "-",
                f"{e['raft_elections']:.0f}"])
    return rows


PHASE_HEAD = ("config", "phase", "suspicions of n1", "admin p50 / p99 / max (ms)",
              "n1 RSS MiB: agent + workers at end; peak", "n1 cores: agent + workers",
              "normal requests", "router refused (all requests)", "Raft elections")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10/20/10 s phases: a smoke check")
    ap.add_argument("--before", type=float, help="seconds of light load before (20; quick 10)")
    ap.add_argument("--during", type=float, help="seconds of saturation (60; quick 20)")
    ap.add_argument("--after", type=float, help="seconds of light load after (20; quick 10)")
    ap.add_argument("--configs", default="workers,agent",
                    help=f"comma-separated, of {', '.join(CONFIGS)}")
    ap.add_argument("--callers", type=int, default=32, help="normal callers during")
    ap.add_argument("--abusers", type=int, default=4, help="abusive callers during")
    ap.add_argument("--huge-mib", type=int, default=900,
                    help="one request this large at the start of during (0: none)")
    ap.add_argument("--inflight-mib", type=int, default=256,
                    help="--router-inflight-mib of the router node")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "overload.json")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    for kind in CHILDREN:
        ap.add_argument(f"--{kind}-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for kind, fn in CHILDREN.items():
        spec = getattr(args, f"{kind}_child")
        if spec:
            return asyncio.run(fn(json.loads(spec)))
    q = args.quick
    args.before = args.before or (10.0 if q else 20.0)
    args.during = args.during or (20.0 if q else 60.0)
    args.after = args.after or (10.0 if q else 20.0)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:
        if c not in CONFIGS:
            ap.error(f"--configs: {c!r} is not one of {', '.join(CONFIGS)}")
    from meshd.dev.triton import DEFAULT_REPO, TritonServer, unavailable_reason

    reason = unavailable_reason()
    if reason:
        print(f"overload: Triton is unavailable here: {reason}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="meshd-bench-overload-"))
    log(f"overload{' (quick)' if q else ''}: work dir {workdir}; load average {loadavg()}")
    triton = TritonServer(DEFAULT_REPO, workdir / "triton", models=[MODEL], name="triton")
    results: dict[str, Any] = {}
    failed: list[str] = []
    try:
        triton.start(timeout=180)
        _renice(triton.child_pids(), OTHERS_NICE)
        for name in configs:
            try:
                results[name] = run_config(args, name, triton, workdir)
            except Exception as exc:  # noqa: BLE001 - reported
                failed.append(f"{name}: {type(exc).__name__}: {exc}")
                log(f"{name} FAILED: {exc}")
    finally:
        triton.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    head = ("measurement", *(CONFIG_LABEL[c] for c in results), "bar", "result (default)")
    rows = []
    measured = {c: bars(r, args.inflight_mib, args.huge_mib) for c, r in results.items()}
    for key, (text, bar) in BAR_TEXT.items():
        ok = measured["workers"][key][0] if "workers" in measured else None
        rows.append([text, *(measured[c][key][1] for c in results), bar,
                     verdict(ok) if ok is not None else "-"])
    for c, r in results.items():
        codes = ", ".join(f"{k} {'/'.join(f'{o} {n}' for o, n in sorted(v.items()))}"
                          for k, v in sorted(r["abuse"].items()))
        results[c]["abuse_text"] = codes
    title = ("Overload: a router node saturated and fed oversized and malformed requests; "
             "the router in a worker (default) vs in the agent"
             + (": QUICK sizes" if q else ""))
    footer_lines = [
        f"phases {args.before:.0f}/{args.during:.0f}/{args.after:.0f} s; {args.callers} "
        f"normal callers and {args.abusers} abusive ones during (they and Triton at nice "
        f"{OTHERS_NICE}); in-flight budget "
        f"{args.inflight_mib} MiB"]
    for c, r in results.items():
        footer_lines.append(f"{c}: abusive requests by kind and outcome: {r['abuse_text']}; "
                            f"other processes used {r['machine']['other_cores'] or 0:.2f} "
                            f"cores; load {r['machine']['loadavg_after']}")
    if failed:
        footer_lines.append("FAILED: " + "; ".join(failed))
    publish(args.out, "overload", title, head, rows, started, q,
            {"configs": {c: CONFIGS[c] for c in configs}, "before_s": args.before,
             "during_s": args.during, "after_s": args.after, "callers": args.callers,
             "abusers": args.abusers, "huge_mib": args.huge_mib,
             "inflight_mib": args.inflight_mib, "kinds": KINDS, "failed": failed},
            results, footer="; ".join(footer_lines[:1]))
    detail = format_table(PHASE_HEAD, phase_rows(results)) if results else ""
    print("\n" + detail + "\n\n" + "\n".join(f"* {line}" for line in footer_lines))
    md = args.out.with_suffix(".md")
    md.write_text(md.read_text() + "\n### By phase\n\n" + detail + "\n\n"
                  + "\n".join(f"* {line}" for line in footer_lines) + "\n\n`"
                  + " ".join(["bench/overload.py", *sys.argv[1:]]) + "`\n")
    return 1 if failed else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
