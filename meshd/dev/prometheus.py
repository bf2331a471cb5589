"""A real Prometheus for the local mesh (``./dev mesh``) and the tests: the ``prometheus``
binary (Debian's ``prometheus`` package, or any on ``PATH``) scraping the nodes' ``/metrics``
with the rules shipped in ``deploy/prometheus/``.

It is started only when the binary is there; the mesh runs without it otherwise.  The HTTP API
is what the Grafana dashboards in ``deploy/grafana/`` query (add it as a Prometheus data
source), and what :meth:`PrometheusServer.query` asks.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from meshd.dev.ports import pick_ports

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus"
"""The recording and alerting rules every Prometheus of a meshd fleet should load."""
JOB = "meshd"


class PrometheusError(RuntimeError):
    pass


def binary() -> str | None:
    """The ``prometheus`` executable, or None when it is not installed."""
    return shutil.which("prometheus")


def config(targets: list[str], *, interval: float, rules: list[Path],
           extra: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """A scrape config: ``targets`` (host:port of each node's metrics) as job ``meshd``, and
    ``extra`` jobs (name -> targets, e.g. the Triton servers' own metrics)."""
    every = f"{max(1, round(interval))}s"
    jobs = [{"job_name": JOB, "static_configs": [{"targets": targets}]}]
    jobs += [{"job_name": name, "static_configs": [{"targets": t}]}
             for name, t in (extra or {}).items()]
    return {"global": {"scrape_interval": every, "evaluation_interval": every,
                       "scrape_timeout": every},
            "rule_files": [str(p) for p in rules], "scrape_configs": jobs}


class PrometheusServer:
    """One ``prometheus`` process with its config and data under ``work``."""

    def __init__(self, work: Path, targets: list[str], *, interval: float = 2.0,
                 extra: dict[str, list[str]] | None = None, port: int = 0,
                 rules: list[Path] | None = None) -> None:
        exe = binary()
        if exe is None:
            raise PrometheusError("prometheus is not installed (Debian: apt install "
                                  "prometheus)")
        self.exe = exe
        self.work = work
        self.port = port or pick_ports("127.0.0.1", 1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.rules = sorted(RULES.glob("*.yml")) if rules is None else rules
        self.config = config(targets, interval=interval, rules=self.rules, extra=extra)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = work / "prometheus.log"

    def start(self, timeout: float = 30.0) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        path = self.work / "prometheus.yml"
        path.write_text(json.dumps(self.config, indent=1))  # JSON is YAML
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                [self.exe, f"--config.file={path}", f"--storage.tsdb.path={self.work / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
                 "--storage.tsdb.retention.time=1d"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            log.close()
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise PrometheusError(f"prometheus exited ({self.proc.returncode}): "
                                      f"{self.log_tail()}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            time.sleep(0.2)
        self.stop()
        raise PrometheusError(f"prometheus not ready in {timeout:.0f} s: {self.log_tail()}")

    def log_tail(self, lines: int = 10) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>``'s ``data``; PrometheusError with Prometheus's message when
        it answers with an error (a query that does not parse, say)."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as exc:
            try:
                body = json.load(exc)
            except ValueError:
                raise PrometheusError(f"{path}: HTTP {exc.code}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result (a vector's samples; a scalar as one sample)."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])
