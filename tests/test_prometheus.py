"""A real Prometheus (Debian's ``prometheus``) scraping a live mesh under load: 3 coordinators,
a router, two GPU trainers (their NVML answered by tests/fake_nvml.py, everything else real)
with real Triton servers attached, a two-node training job reporting its collectives, a
coordinator placing models (``--model-control`` beside a Triton in explicit model control: one
pinned model loaded there, one refused), and tritonclient traffic through the router.

Then every dashboard panel query in deploy/grafana must parse and its panel return data, every
rule in deploy/prometheus must evaluate without error (Prometheus's own rule health), and every
``meshd_*`` series Prometheus holds must be in the metric table (meshd/metrics/schema.py) with
exactly its labels."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from meshd.dev import prometheus as devprometheus
from meshd.dev.prometheus import PrometheusServer
from meshd.metrics.schema import METRICS
from testbed.cluster import TRUST_DOMAIN
from tests.test_consensus_integration import (  # noqa: F401
    CONVERGE,
    Mesh,
    apply,
    meshes,
    wait_ready,
)
from tests.test_train_integration import submit, wait_job
from tests.triton import add_sub_inputs

ROOT = Path(__file__).resolve().parent.parent
LOAD_SECONDS = 30.0
SCRAPE = 2.0
RATE_WINDOW = "20s"
"""What ``$__rate_interval`` is here: Grafana makes it at least four scrape intervals."""

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"),
                       reason="needs Linux (one loopback address per node)"),
    pytest.mark.skipif(devprometheus.binary() is None,
                       reason="prometheus is not installed (apt install prometheus; "
                              ".ci/run installs it when root)"),
]


def dashboards() -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location(
        "meshd_dashboards", ROOT / "deploy" / "grafana" / "dashboards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.DASHBOARDS)


def test_the_committed_dashboards_are_the_generated_ones() -> None:
    module_boards = dashboards()
    for name, board in module_boards.items():
        path = ROOT / "deploy" / "grafana" / "dashboards" / f"{name}.json"
        assert json.loads(path.read_text()) == board, \
            f"{path} is stale: python deploy/grafana/dashboards.py"
    files = {p.stem for p in (ROOT / "deploy" / "grafana" / "dashboards").glob("*.json")}
    assert files == set(module_boards)


def substitute(expr: str) -> str:
    """A panel query as Grafana sends it with "All" picked in every variable."""
    return (expr.replace("$__rate_interval", RATE_WINDOW).replace("$node", ".+")
            .replace("$model", ".+"))


SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def table_name(series: str) -> str | None:
    if series in METRICS:
        return series
    for suffix in SUFFIXES:
        if series.endswith(suffix) and series[: -len(suffix)] in METRICS:
            return series[: -len(suffix)]
    return None


# --- the mesh --------------------------------------------------------------------------------


def traffic(router: str, creds: Path, stop: threading.Event, errors: list[str]) -> None:
    import numpy as np
    import tritonclient.grpc as tc

    from certs.spiffe import any_node_dns

    client = tc.InferenceServerClient(
        router, ssl=True, root_certificates=str(creds / "bundle.pem"),
        private_key=str(creds / "key.pem"), certificate_chain=str(creds / "cert.pem"),
        channel_args=[("grpc.ssl_target_name_override", any_node_dns(TRUST_DOMAIN))])
    a = np.arange(8, dtype=np.float32).reshape(1, 8)
    payload = tc.InferInput("PAYLOAD", [16], "FP32")
    payload.set_data_from_numpy(np.zeros(16, dtype=np.float32))
    while not stop.is_set():
        try:
            client.infer("add_sub", add_sub_inputs(a, a, tc), client_timeout=10)
            client.infer("delay", [payload], client_timeout=10)
        except Exception as exc:  # noqa: BLE001 - counted; a few while replicas warm up
            errors.append(str(exc))
            stop.wait(0.2)


@pytest.fixture
def loaded(meshes: Callable[..., Mesh], triton_factory: Any,  # noqa: F811
           tmp_path: Path) -> Iterator[tuple[Mesh, PrometheusServer]]:
    a, b = triton_factory(2, timeout=120)
    (placed,) = triton_factory(1, explicit=True, models=[], timeout=120)
    gpu = ["--role", "gpu", "--role", "trainer"]
    mesh = meshes(3, 2, start=False, extra={
        1: ["--role", "router", "--gpu", "off"], 2: ["--gpu", "off"],
        3: ["--gpu", "off", "--triton", placed.meshd_spec, "--model-control",
            "--model-slots", "1"],
        4: [*gpu, "--triton", a.meshd_spec],
        5: [*gpu, "--triton", b.meshd_spec]})
    c = mesh.c
    for n in c.nodes[3:]:
        n.module = "tests.fake_gpu_agent"
    c.start()
    c.wait_converged(CONVERGE)
    wait_ready(mesh, voters=3)
    prom = PrometheusServer(tmp_path / "prometheus",
                            [f"{n.ip}:{n.metrics_port}" for n in c.nodes], interval=SCRAPE,
                            extra={"triton": [f"{s.host}:{s.metrics_port}" for s in (a, b)]})
    prom.start()
    try:
        yield mesh, prom
    finally:
        prom.stop()


def test_every_panel_and_rule_works_against_a_live_mesh(
        loaded: tuple[Mesh, PrometheusServer], tmp_path: Path) -> None:
    mesh, prom = loaded
    c, seed = mesh.c, mesh.c.seed
    c.wait_for(lambda: len(seed.members(role=["trainer"])) == 2, 20, "two trainers")
    # Model placement (the models dashboard): add_sub pinned to one replica, which only the
    # third coordinator can take (it loads it into its explicit-mode Triton), and a model no
    # node can take, refused.
    apply(c, seed, json.dumps({"kind": "ModelPin", "name": "add_sub",
                               "spec": {"min_replicas": 1, "max_replicas": 1}}))
    apply(c, seed, json.dumps({"kind": "ModelPin", "name": "absent",
                               "spec": {"min_replicas": 1, "nodes": ["nowhere"]}}))
    c.wait_for(lambda: any(n == "meshd_models_replicas" and v == 1 and lab["model"] == "add_sub"
                           and lab["state"] == "ready" for n, lab, v in c.nodes[2].metrics()),
               60, "add_sub placed and loaded")
    spec = {"id": "prom", "model": "logreg", "entry": "meshd.train.sample:main",
            "checkpoints": str(tmp_path / "prom"), "gpus": {"count": 2, "nodes": 2},
            "hyperparameters": {"steps": 100000, "step_seconds": 0.05,
                                "checkpoint_every": 10}}
    submit(mesh, seed, json.dumps(spec))
    wait_job(mesh, seed, "prom", lambda s: s.state == "running", 30, "the gang running")
    # A plaintext peer on the Raft port is refused (TLS only): the security panel shows it.
    with socket.create_connection((seed.ip, mesh.raft_port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        with contextlib.suppress(OSError):
            while sock.recv(4096):
                pass
    stop, errors = threading.Event(), []
    workers = [threading.Thread(target=traffic, args=(seed.router, c.admin_creds, stop,
                                                      errors)) for _ in range(3)]
    for w in workers:
        w.start()
    try:
        time.sleep(LOAD_SECONDS)
    finally:
        stop.set()
        for w in workers:
            w.join(15)
    assert len(errors) < 10, errors[:5]

    failures = []
    for board_name, board in dashboards().items():
        for var in board["templating"]["list"][1:]:
            m = re.fullmatch(r"label_values\((\w+), (\w+)\)", var["query"]["query"])
            assert m is not None, var
            values = prom.api(f"label/{m.group(2)}/values", **{"match[]": m.group(1)})
            if not values:
                failures.append(f"{board_name}: variable {var['name']} has no values")
        for panel in board["panels"]:
            got = 0
            for target in panel["targets"]:
                expr = substitute(target["expr"])
                try:
                    got += len(prom.query(expr))
                except devprometheus.PrometheusError as exc:
                    failures.append(f"{board_name} / {panel['title']}: {expr}: {exc}")
            if not got:
                failures.append(f"{board_name} / {panel['title']}: no data")
    rules = prom.api("rules")["groups"]
    assert sum(len(g["rules"]) for g in rules) >= 15
    for group in rules:
        for rule in group["rules"]:
            if rule["health"] != "ok":
                failures.append(f"rule {rule['name']}: {rule['health']} {rule.get('lastError')}")
            try:
                prom.query(rule["query"])
            except devprometheus.PrometheusError as exc:
                failures.append(f"rule {rule['name']}: {exc}")
    for series in prom.api("series", **{"match[]": '{__name__=~"meshd_.+"}'}):
        name = table_name(series["__name__"])
        if name is None:
            failures.append(f"{series['__name__']} is not in meshd/metrics/schema.py")
            continue
        labels = set(series) - {"__name__", "job", "instance", "le"}
        if labels != set(METRICS[name].labels):
            failures.append(f"{series['__name__']}: labels {sorted(labels)}, the table says "
                            f"{sorted(METRICS[name].labels)}")
    assert not failures, "\n".join(failures)
    firing = [a["labels"]["alertname"] for a in prom.api("alerts")["alerts"]
              if a["state"] == "firing"]
    assert not firing, f"alerts firing on a healthy mesh: {firing}"
