"""Run Triton's own Python example clients against a KServe v2 endpoint; report pass/fail.

    .venv/bin/python bench/triton_examples.py --examples DIR \\
        --url-grpc HOST:PORT --url-http HOST:PORT [--only NAMES] [--out FILE.json]
    .venv/bin/python bench/triton_examples.py --from-mirror GIT_DIR --url-grpc ... --url-http ...
    .venv/bin/python bench/triton_examples.py --from-mirror GIT_DIR --start-triton 1  # baseline

The clients are the scripts of ``src/python/examples`` in triton-inference-server/client (none
of them is part of this repository). ``--examples`` names a directory holding them;
``--from-mirror`` takes a git directory of that repository (a bare mirror will do: it is read
with ``git ls-tree`` / ``git show`` at ``--rev``) and extracts them into a temporary directory,
deleted at the end.

Each example runs as a subprocess of this interpreter (it needs ``tritonclient[all]``), one at a
time (several share fixed shared-memory keys such as ``/input0_simple``), in the scripts'
directory, with ``-u URL``: the gRPC URL for gRPC clients, the HTTP one (``host:port``, no
scheme) for HTTP clients, ``--timeout`` seconds each (60). A case passes when the script exits
0, prints none of the failure markers (some examples ``sys.exit()`` with status 0 after
"context creation failed") and, if the script has a ``print("PASS...")``, prints that line
(some just end, status 0, when their last check does not hold). Some scripts run more than
once, with extra arguments: the sequence clients also with ``-d`` (the dyna models),
``reuse_infer_objects_client`` with ``-i grpc`` and ``-i http``, the gRPC/HTTP infer clients
(sync and aio) also with compression (gzip / deflate).

Not run (the table says why): the image/densenet/ensemble clients (need image models and
inputs), the CUDA shared-memory ones, ``memory_growth_test`` (no ``-u``: it dials
localhost:8000/8001) and, unless an explicit-mode endpoint is given, the model-control ones.
``simple_*_model_control`` need a server in ``--model-control-mode=explicit`` whose repository
index holds exactly 8 (gRPC) / 7 (HTTP) models including ``simple``: pass such endpoints as
``--url-grpc-explicit`` / ``--url-http-explicit``; with ``--start-triton`` the runner starts one
per client itself, on a temporary repository of that many links into ``--repo``.

``--start-triton N`` starts N real Triton servers (``meshd.dev.triton.TritonServer``, CPU Triton
2.51 from the nvidia-pytriton wheel) on ``--repo`` (default ``tests/triton_examples``, models
written for these clients), runs the examples against the first one, stops them all, and then
runs the model-control clients, each on a server of its own (one at a time). Servers
are started with ``--id=triton``: the health/metadata clients insist on server name "triton".

Prints a Markdown table (example | result | detail) and, with ``--out``, writes JSON (each
case's command, exit code, duration and output tail). Exit status: 0 when nothing failed or
timed out; ``xfail`` marks a failure that is a known bug of the server (Triton 2.51), see
``KNOWN_FAILURES``.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder comes first on sys.path and a bench module could shadow
# a package; make the checkout root importable instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.table import format_table  # noqa: E402

DEFAULT_REPO = ROOT / "tests" / "triton_examples"
EXAMPLES_PATH = "src/python/examples"
TIMEOUT_S = 60.0
TAIL_LINES = 20

FAILURE_MARKERS = ("FAILED", "context creation failed", "channel creation failed",
                   "Traceback (most recent call last)")
"""Output that fails a case even when the script exits 0."""

SKIPPED = {
    "grpc_client": "needs densenet_onnx and an image",
    "image_client": "needs image models and an image",
    "grpc_image_client": "needs image models and an image",
    "ensemble_image_client": "needs the image ensemble",
    "simple_grpc_cudashm_client": "CUDA shared memory",
    "simple_http_cudashm_client": "CUDA shared memory",
    "memory_growth_test": "no -u option (dials localhost:8000/8001)",
}
"""Scripts never run, with the reason shown in the table."""

KNOWN_FAILURES = {
    "simple_grpc_model_control": (
        "for oversized file parameter",
        "Triton 2.51 aborts (std::filesystem_error) on a load with an over-long file: name; "
        "the client (PR #887) expects a fixed server; --rev 3b3690bd~1 predates the check"),
}
"""Failures of the server rather than of the endpoint under test: (marker in the output,
explanation). A case failing with its marker counts as ``xfail``, not as a failure."""

MODEL_CONTROL_INDEX = {"simple_grpc_model_control": 8, "simple_http_model_control": 7}
"""Model-control clients and the repository-index size each one checks for."""

VARIANTS: dict[str, list[list[str]]] = {
    "simple_grpc_sequence_stream_infer_client": [[], ["-d"]],
    "simple_grpc_sequence_sync_infer_client": [[], ["-d"]],
    "simple_grpc_aio_sequence_stream_infer_client": [[], ["-d"]],
    "simple_http_sequence_sync_infer_client": [[], ["-d"]],
    "reuse_infer_objects_client": [["-i", "grpc"], ["-i", "http"]],
    "simple_grpc_infer_client": [[], ["-C", "gzip"]],
    "simple_grpc_aio_infer_client": [[], ["-C", "deflate"]],
    "simple_http_infer_client": [[], ["--request-compression-algorithm", "gzip",
                                      "--response-compression-algorithm", "gzip"]],
    "simple_http_aio_infer_client": [[], ["--request-compression-algorithm", "deflate",
                                          "--response-compression-algorithm", "deflate"]],
}
"""Scripts run more than once, with these extra arguments (default: once, with none)."""


@dataclass
class Case:
    script: str
    """The script's stem (``simple_grpc_infer_client``)."""
    args: list[str]
    protocol: str
    """``grpc`` or ``http``: which URL it gets."""
    explicit: bool = False
    """Needs an explicit-model-control server (the model-control clients)."""
    skip: str = ""
    """Why it is not run ("" = run it)."""
    says_pass: bool = False
    """The script prints a "PASS..." line on success (then a run without one fails: some
    scripts just end, status 0, when a check does not hold)."""

    @property
    def name(self) -> str:
        return " ".join([self.script, *self.args])


@dataclass
class Outcome:
    name: str
    result: str
    """``pass``, ``fail``, ``xfail`` (a known server bug), ``timeout`` or ``skip``."""
    detail: str
    command: list[str] = field(default_factory=list)
    url: str = ""
    rc: int | None = None
    seconds: float = 0.0
    tail: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- the cases


def _protocol(script: str, args: list[str]) -> str:
    if "-i" in args:
        return args[args.index("-i") + 1]
    return "grpc" if "grpc" in script else "http"


def discover(examples: Path) -> list[Case]:
    """One case per (script, variant) found in ``examples``, in name order."""
    cases: list[Case] = []
    for path in sorted(examples.glob("*.py")):
        script = path.stem
        for args in VARIANTS.get(script, [[]]):
            source = path.read_text(errors="replace")
            case = Case(script, list(args), _protocol(script, args),
                        explicit=script in MODEL_CONTROL_INDEX,
                        says_pass='print("PASS' in source)
            if script in SKIPPED:
                case.skip = SKIPPED[script]
            elif "--url" not in source:
                case.skip = "no -u option"
            cases.append(case)
    return cases


def select(cases: list[Case], only: str | None) -> list[Case]:
    """The cases ``only`` names (comma-separated script stems, case names or globs)."""
    if not only:
        return cases
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    return [c for c in cases
            if any(fnmatch.fnmatchcase(c.script, w) or fnmatch.fnmatchcase(c.name, w)
                   for w in wanted)]


@contextlib.contextmanager
def from_mirror(git_dir: Path, rev: str) -> Iterator[Path]:
    """``src/python/examples/*.py`` of ``git_dir`` at ``rev``, in a temporary directory."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(git_dir), *args], check=True,
                              capture_output=True, text=True).stdout

    with tempfile.TemporaryDirectory(prefix="triton-examples-") as tmp:
        out = Path(tmp)
        for path in git("ls-tree", "--name-only", f"{rev}:{EXAMPLES_PATH}").split():
            if path.endswith(".py"):
                (out / path).write_text(git("show", f"{rev}:{EXAMPLES_PATH}/{path}"))
        yield out


# --------------------------------------------------------------------------- running


def _hostport(url: str) -> str:
    return url.split("://", 1)[-1].rstrip("/")


def _detail(lines: list[str], ok: bool) -> str:
    if ok:
        passes = [ln for ln in lines if ln.startswith("PASS")]
        text = passes[-1] if passes else "exit 0"
    else:
        text = " / ".join(lines[-3:])
    return text if len(text) <= 200 else text[:197] + "..."


def run_case(case: Case, examples: Path, url: str, python: str, timeout: float) -> Outcome:
    """Run one case against ``url`` (host:port) and judge it."""
    if case.skip:
        return Outcome(case.name, "skip", case.skip)
    command = [python, str(examples / f"{case.script}.py"), *case.args, "-u", _hostport(url)]
    started = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run(command, cwd=examples, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, check=False)
        output, rc = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as exc:
        output, rc = exc.stdout or b"", None
    seconds = time.monotonic() - started
    lines = [ln.rstrip() for ln in output.decode(errors="replace").splitlines() if ln.strip()]
    if rc is None:
        result, detail = "timeout", f"no exit after {timeout:.0f} s: " + _detail(lines, False)
    else:
        marker = next((m for m in FAILURE_MARKERS if any(m in ln for ln in lines)), None)
        if marker is None and case.says_pass and not any(ln.startswith("PASS") for ln in lines):
            marker = "no PASS line"
        ok = rc == 0 and marker is None
        result = "pass" if ok else "fail"
        detail = _detail(lines, ok)
        if not ok and rc == 0:
            detail = f"exit 0 but {marker if marker == 'no PASS line' else repr(marker)}: {detail}"
        elif not ok:
            detail = f"exit {rc}: {detail}"
        known = KNOWN_FAILURES.get(case.script)
        if not ok and known and any(known[0] in ln for ln in lines):
            result, detail = "xfail", known[1]
    return Outcome(case.name, result, detail, command=command, url=url, rc=rc,
                   seconds=round(seconds, 2), tail=lines[-TAIL_LINES:])


def run_cases(cases: list[Case], examples: Path, urls: dict[str, str], python: str,
              timeout: float) -> list[Outcome]:
    outcomes = []
    for case in cases:
        if case.skip:
            outcome = Outcome(case.name, "skip", case.skip)
        else:
            outcome = run_case(case, examples, urls[case.protocol], python, timeout)
        print(f"  {outcome.result:7} {outcome.name} ({outcome.seconds:.1f} s)", flush=True)
        outcomes.append(outcome)
    return outcomes


# --------------------------------------------------------------------------- real Tritons


def _server_urls(server: Any) -> dict[str, str]:
    return {"grpc": server.grpc_url, "http": _hostport(server.http_url)}


@contextlib.contextmanager
def meshd_router(servers: list[Any], work: Path, workers: int) -> Iterator[dict[str, str]]:
    """A real meshd agent (``--dev --role router``, ``--router-workers``) with ``servers``
    attached (``--triton``), once it routes every model they serve: its gRPC and HTTP URLs."""
    import tritonclient.grpc as tc

    from meshd.dev.ports import pick_ports

    ports = pick_ports("127.0.0.1", 5)
    grpc_url, http_url = f"127.0.0.1:{ports[3]}", f"127.0.0.1:{ports[4]}"
    cmd = [sys.executable, "-m", "meshd.cli", "--dev", "--node", "router",
           "--bind", f"127.0.0.1:{ports[0]}", "--admin", f"127.0.0.1:{ports[1]}",
           "--score", f"127.0.0.1:{ports[2]}", "--metrics", "off", "--role", "router",
           "--router", grpc_url, "--router-http", http_url,
           "--router-workers", str(workers), "--data-dir", str(work), "--log-level", "warning"]
    for server in servers:
        cmd += ["--triton", server.meshd_spec]  # with http=: HTTP is forwarded as it came
    work.mkdir(parents=True, exist_ok=True)
    log_file = open(work / "agent.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    log_file.close()
    try:
        want = {m["name"] for m in tc.InferenceServerClient(servers[0].grpc_url)
                .get_model_repository_index(as_json=True).get("models", [])
                if m.get("state") == "READY"}
        end = time.monotonic() + 60
        while True:
            try:
                index = tc.InferenceServerClient(grpc_url).get_model_repository_index(
                    as_json=True)
                if want <= {m["name"] for m in index.get("models", [])
                            if m.get("state") == "READY"}:
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if proc.poll() is not None or time.monotonic() > end:
                tail = (work / "agent.log").read_text(errors="replace").splitlines()[-15:]
                raise SystemExit("the meshd router did not come up; its log ends:\n"
                                 + "\n".join(tail))
            time.sleep(0.5)
        time.sleep(2.0)  # the worker processes listening too
        yield {"grpc": grpc_url, "http": http_url}
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def sized_repository(repo: Path, count: int, dest: Path) -> Path:
    """A repository of ``count`` links into ``repo``: ``simple`` and the first others."""
    models = sorted(p.name for p in repo.iterdir() if (p / "config.pbtxt").is_file())
    if "simple" not in models or len(models) < count:
        raise SystemExit(f"{repo} needs 'simple' and at least {count} models for model control")
    chosen = ["simple", *[m for m in models if m != "simple"][:count - 1]]
    dest.mkdir(parents=True)
    for name in chosen:
        (dest / name).symlink_to(repo / name, target_is_directory=True)
    return dest


def run_with_triton(args: argparse.Namespace, cases: list[Case],
                    examples: Path) -> tuple[list[Outcome], dict[str, Any]]:
    from meshd.dev.triton import TritonServer, start_all, stop_all, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"cannot start Triton: {reason}")
    repo = Path(args.repo).resolve()
    plain = [c for c in cases if not c.explicit]
    control = [c for c in cases if c.explicit and not c.skip]
    setup: dict[str, Any] = {"repo": str(repo), "servers": []}
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="triton-examples-servers-") as tmp:
        work = Path(tmp)
        servers = [TritonServer(repo, work / f"triton{i}", name="triton")
                   for i in range(args.start_triton)]
        if not any(not c.skip for c in plain):
            servers = []  # nothing but model control (or skips) selected
            outcomes += run_cases(plain, examples, {}, args.python, args.timeout)
        try:
            if servers:
                print(f"starting {len(servers)} Triton server(s) on {repo} ...", flush=True)
                start_all(servers, timeout=120)
                for s in servers:
                    setup["servers"].append(_server_urls(s))
                    print(f"  triton: grpc {s.grpc_url}  http {s.http_url}", flush=True)
                outcomes += run_cases(plain, examples, _server_urls(servers[0]), args.python,
                                      args.timeout)
                if args.through_router:
                    with meshd_router(servers, work / "router", args.router_workers) as urls:
                        setup["router"] = urls
                        print(f"through the meshd router: grpc {urls['grpc']}  http "
                              f"{urls['http']}", flush=True)
                        routed = run_cases(plain, examples, urls, args.python, args.timeout)
                    setup["through_router"] = [asdict(o) for o in routed]
        finally:
            stop_all(servers)
        for case in control:
            size = MODEL_CONTROL_INDEX[case.script]
            sized = sized_repository(repo, size, work / f"repo-{case.script}")
            server = TritonServer(sized, work / f"explicit-{case.script}", explicit=True,
                                  name="triton")
            try:
                print(f"starting an explicit-mode Triton ({size} models) for {case.name} ...",
                      flush=True)
                server.start(timeout=120)
                outcomes += run_cases([case], examples, _server_urls(server), args.python,
                                      args.timeout)
            finally:
                server.stop()
    return outcomes, setup


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--examples", type=Path, help="directory holding the example scripts")
    source.add_argument("--from-mirror", type=Path, metavar="GIT_DIR",
                        help="git directory of triton-inference-server/client")
    p.add_argument("--rev", default="HEAD", help="revision for --from-mirror (HEAD)")
    p.add_argument("--url-grpc", help="gRPC endpoint, host:port")
    p.add_argument("--url-http", help="HTTP endpoint, host:port")
    p.add_argument("--url-grpc-explicit", help="gRPC endpoint of an explicit-mode server "
                   "(8 models in its index) for simple_grpc_model_control")
    p.add_argument("--url-http-explicit", help="HTTP endpoint of an explicit-mode server "
                   "(7 models in its index) for simple_http_model_control")
    p.add_argument("--start-triton", type=int, default=0, metavar="N",
                   help="start N Tritons on --repo and run against the first")
    p.add_argument("--through-router", action="store_true",
                   help="with --start-triton: also run them through a meshd router (a real "
                        "agent, --dev --role router) in front of all the Tritons")
    p.add_argument("--router-workers", type=int, default=2, metavar="N",
                   help="processes serving the router's ports with --through-router (2)")
    p.add_argument("--repo", type=Path, default=DEFAULT_REPO,
                   help=f"model repository for --start-triton ({DEFAULT_REPO.relative_to(ROOT)})")
    p.add_argument("--only", help="comma-separated script names, case names or globs")
    p.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per example (60)")
    p.add_argument("--python", default=sys.executable, help="interpreter for the examples")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.start_triton < 0:
        p.error("--start-triton must be >= 0")
    if args.through_router and not args.start_triton:
        p.error("--through-router needs --start-triton N")
    if not args.start_triton and not (args.url_grpc and args.url_http):
        p.error("give --url-grpc and --url-http, or --start-triton N")

    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        if args.from_mirror:
            examples = stack.enter_context(from_mirror(args.from_mirror, args.rev))
        else:
            examples = args.examples.resolve()
            if not examples.is_dir():
                p.error(f"{examples} is not a directory")
        cases = select(discover(examples), args.only)
        if not cases:
            p.error("no example selected")
        print(f"{len(cases)} case(s) from {args.from_mirror or examples}", flush=True)
        setup: dict[str, Any]
        if args.start_triton:
            outcomes, setup = run_with_triton(args, cases, examples)
        else:
            urls = {"grpc": args.url_grpc, "http": args.url_http}
            setup = {"urls": urls}
            plain = [c for c in cases if not c.explicit]
            outcomes = run_cases(plain, examples, urls, args.python, args.timeout)
            explicit = {"grpc": args.url_grpc_explicit, "http": args.url_http_explicit}
            for case in (c for c in cases if c.explicit):
                if case.skip or not explicit[case.protocol]:
                    why = case.skip or f"needs --url-{case.protocol}-explicit"
                    outcomes.append(Outcome(case.name, "skip", why))
                    continue
                outcomes += run_cases([case], examples, {case.protocol: explicit[case.protocol]},
                                      args.python, args.timeout)
    # skipped model-control cases under --start-triton are reported too
    seen = {o.name for o in outcomes}
    outcomes += [Outcome(c.name, "skip", c.skip) for c in cases if c.name not in seen]

    routed = {o["name"]: o for o in setup.get("through_router", [])}
    if routed:
        rows = [[o.name, o.result.upper(),
                 routed[o.name]["result"].upper() if o.name in routed else "-",
                 (routed[o.name]["detail"] if o.name in routed and
                  routed[o.name]["result"] != "pass" else o.detail).replace("|", "\\|")]
                for o in outcomes]
        print()
        print(format_table(["example", "direct", "through the router", "detail"], rows))
    else:
        rows = [[o.name, o.result.upper(), o.detail.replace("|", "\\|")] for o in outcomes]
        print()
        print(format_table(["example", "result", "detail"], rows))
    counts = {r: sum(o.result == r for o in outcomes)
              for r in ("pass", "fail", "xfail", "timeout", "skip")}
    if routed:
        via = {r: sum(o["result"] == r for o in routed.values())
               for r in ("pass", "fail", "xfail", "timeout", "skip")}
        print("\nthrough the router: " + ", ".join(f"{n} {r}" for r, n in via.items()))
        counts = {r: counts[r] + via[r] for r in counts}
    wall = time.monotonic() - started
    print("\n" + ", ".join(f"{n} {r}" for r, n in counts.items()) + f"; {wall:.0f} s")
    if args.out:
        report = {"benchmark": "triton_examples", "argv": sys.argv,
                  "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "source": str(args.from_mirror or args.examples), "rev": args.rev,
                  "setup": setup, "counts": counts, "wall_s": round(wall, 1),
                  "results": [asdict(o) for o in outcomes]}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 1 if counts["fail"] or counts["timeout"] else 0


if __name__ == "__main__":
    sys.exit(main())
