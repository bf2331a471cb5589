"""deploy/k8s: both overlays build with ``kubectl kustomize``, every object validates against
the Kubernetes schemas (``kubernetes-validate``), and the manifests say what the design needs
(coordinators, agents, one-way trust to Triton, secrets wired, metrics scraped).  The dev
overlay is built with a real CA (``meshctl ca init``) and join token in its secrets/.

deploy/docker: the Dockerfile is multi-stage, runs as a numeric non-root user, and copies
every package the wheel needs; the wheel its build stage installs is built here."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from certs import tokens
from certs.ca import CertificateAuthority

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed "
                                   "(it builds the Kustomize overlays)")


def build(overlay: Path) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    done = subprocess.run([KUBECTL, "kustomize", str(overlay)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture(scope="module")
def overlays(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Both overlays, built from a copy of deploy/k8s whose dev secrets/ holds a real CA and
    a join token that CA signed."""
    if KUBECTL is None:
        pytest.skip("kubectl is not installed")
    work = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, work)
    secrets = work / "overlays" / "dev" / "secrets"
    ca = CertificateAuthority.create("meshd.test")
    ca.save(secrets / "ca")
    token, _ = tokens.create(ca, uses=10, ttl=3600.0, now=time.time())
    (secrets / "token").write_text(token)
    return {name: build(work / "overlays" / name) for name in ("dev", "production")}


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


@needs_kubectl
@pytest.mark.parametrize("name", ["dev", "production"])
def test_every_object_validates_against_the_kubernetes_schemas(
        overlays: dict[str, list[dict[str, Any]]], name: str) -> None:
    import kubernetes_validate

    checked = 0
    for doc in overlays[name]:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: checked in the next test
        try:
            kubernetes_validate.validate(doc, "1.31", strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at "
                        f"{'/'.join(map(str, exc.path))}")
        checked += 1
    assert checked >= 10


@needs_kubectl
def test_the_manifests_carry_the_design(overlays: dict[str, list[dict[str, Any]]]) -> None:
    for name, docs in overlays.items():
        coord = one(docs, "StatefulSet", "meshd-coordinator")
        assert coord["spec"]["replicas"] == 3 and coord["spec"]["volumeClaimTemplates"]
        args = coord["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--bootstrap-expect=3" in args and "--ca-dir=/etc/meshd/ca" in args
        mounts = coord["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        assert {"name": "ca", "mountPath": "/etc/meshd/ca", "readOnly": True} in mounts
        agent = one(docs, "DaemonSet", "meshd-agent")
        pod = agent["spec"]["template"]["spec"]
        assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
        agent_args = pod["containers"][0]["args"]
        assert "--role=router" in agent_args and "--role=gpu" in agent_args
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert env["MESHD_JOIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "meshd-join-token"
        for workload in (coord, agent):  # hardened, never root
            spec = workload["spec"]["template"]["spec"]
            assert spec["securityContext"]["runAsNonRoot"] is True
            sc = spec["containers"][0]["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"]
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert spec["automountServiceAccountToken"] is False
        if name == "production":
            assert pod["runtimeClassName"] == "nvidia"
            assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        else:
            assert "runtimeClassName" not in pod and "--gpu=off" in agent_args
        triton = one(docs, "NetworkPolicy", "triton-only-from-routers")
        assert triton["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name":
                                                                "triton"}
        assert set(triton["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        sources = triton["spec"]["ingress"][0]["from"]
        assert sources[0]["podSelector"]["matchLabels"] == {"meshd.io/role": "router"}
        assert agent["spec"]["template"]["metadata"]["labels"]["meshd.io/role"] == "router"
        egress_ports = {p["port"] for rule in triton["spec"]["egress"] for p in rule["ports"]}
        assert egress_ports == {53}, "Triton may only look names up"
        cidr = sources[1]["ipBlock"]["cidr"]
        assert cidr == ("10.0.0.0/16" if name == "production" else "192.0.2.0/24")
        monitor = one(docs, "ServiceMonitor", "meshd")
        selected = monitor["spec"]["selector"]["matchLabels"]
        scraped = [d for d in docs if d["kind"] == "Service"
                   and selected.items() <= d["metadata"].get("labels", {}).items()]
        assert {s["metadata"]["name"] for s in scraped} == {"meshd-coordinators",
                                                            "meshd-agents"}
        assert all(any(p["name"] == "metrics" for p in s["spec"]["ports"]) for s in scraped)
        assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
        one(docs, "PodDisruptionBudget", "meshd-coordinator")
    dev_secrets = {d["metadata"]["name"]: d for d in overlays["dev"] if d["kind"] == "Secret"}
    assert set(dev_secrets) == {"meshd-ca", "meshd-join-token"}
    assert {"ca.pem", "ca.key", "bundle.pem", "ca.json"} <= set(dev_secrets["meshd-ca"]["data"])
    assert not [d for d in overlays["production"] if d["kind"] == "Secret"], \
        "production secrets are made outside git"


@needs_kubectl
def test_a_broken_overlay_fails_to_build(tmp_path: Path) -> None:
    work = tmp_path / "k8s"
    shutil.copytree(K8S, work)
    assert KUBECTL is not None
    done = subprocess.run([KUBECTL, "kustomize", str(work / "overlays" / "dev")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "secrets" in done.stderr  # no CA or token made


def test_the_schema_check_can_fail() -> None:
    import kubernetes_validate

    bad = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "x"},
           "spec": {"selector": {}, "template": {"spec": {"containers": [{"nmae": "typo"}]}}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.31", strict=True)


# --- the image ------------------------------------------------------------------------------


DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"


def test_the_dockerfile_is_multi_stage_non_root_and_copies_every_package() -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\w+))?", text, re.M)
    assert len(stages) >= 2 and stages[0][1] == "build"
    final = text[text.rindex("\nFROM "):]
    assert "COPY --from=build /opt/meshd /opt/meshd" in final
    user = re.findall(r"^USER\s+(\S+)", final, re.M)
    assert user and user[-1].split(":")[0].isdigit() and int(user[-1].split(":")[0]) > 0
    assert re.search(r'^ENTRYPOINT \["meshd"', final, re.M)
    assert not re.search(r"^ADD\s+https?://", text, re.M)
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]
    copied = set(re.findall(r"^COPY (\w+) \1$", text, re.M))
    assert {p.rstrip("*") for p in packages} == copied


@pytest.mark.slow
def test_the_wheel_the_image_installs_builds_and_holds_every_package(tmp_path: Path) -> None:
    """What the build stage's ``pip install .`` builds (without a Docker daemon here), from a
    context holding what the Dockerfile copies and nothing else (built there, not in-tree)."""
    context = tmp_path / "context"
    context.mkdir()
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            *sources, _dest = line.split()[1:]
            for src in sources:
                path = ROOT / src
                if path.is_dir():
                    shutil.copytree(path, context / src,
                                    ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy(path, context / src)
    out = tmp_path / "wheels"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-w", str(out), str(context)],
                          capture_output=True, text=True, timeout=300, cwd=context)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = out.glob("meshd-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for package in ("meshd", "gossip", "topology", "certs", "consensus", "policy", "adapters",
                    "proto"):
        assert f"{package}/__init__.py" in names, package
    assert "meshd/router/traces.py" in names and "proto/mesh/v1/score.proto" in names
    assert not [n for n in names if n.startswith("tests/")]


def test_the_autoscaling_examples_scale_triton_on_meshd_s_placement_signals() -> None:
    """deploy/k8s/autoscaling: the HPA validates against the Kubernetes schemas; the KEDA
    ScaledObject (a CRD) and the prometheus-adapter rules query series meshd exports."""
    import kubernetes_validate

    from meshd.metrics.schema import METRICS

    auto = K8S / "autoscaling"
    (hpa,) = [d for d in yaml.safe_load_all((auto / "hpa-external.yaml").read_text()) if d]
    kubernetes_validate.validate(hpa, "1.31", strict=True)
    assert hpa["spec"]["metrics"][0]["external"]["metric"]["name"] in METRICS
    (scaled,) = [d for d in yaml.safe_load_all((auto / "keda-scaledobject.yaml").read_text())
                 if d]
    assert scaled["kind"] == "ScaledObject"
    assert scaled["spec"]["scaleTargetRef"]["name"] == hpa["spec"]["scaleTargetRef"]["name"]
    queried = {re.match(r"max\((\w+)\{", t["metadata"]["query"]).group(1)  # type: ignore[union-attr]
               for t in scaled["spec"]["triggers"]}
    assert queried and queried <= set(METRICS), queried
    rules = yaml.safe_load((auto / "prometheus-adapter-rules.yaml").read_text())
    assert {r["name"]["as"] for r in rules["rules"]["external"]} <= set(METRICS)
