"""deploy/prometheus's rules pass ``promtool check rules``, and a broken rule file is caught
(so the check can fail).  Evaluating them against a live mesh: tests/test_prometheus.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RULES = sorted((ROOT / "deploy" / "prometheus").glob("*.yml"))
PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed "
                                "(apt install prometheus; .ci/run installs it when root)")


def check(path: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)


def test_every_rule_file_passes_promtool() -> None:
    assert RULES, "deploy/prometheus has no rule files"
    for path in RULES:
        done = check(path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "SUCCESS" in done.stdout


def test_the_alerts_the_operators_need_are_there() -> None:
    text = "\n".join(p.read_text() for p in RULES)
    for alert in ("MeshdNodeDown", "MeshdMemberFlapping", "MeshdNoRaftQuorum",
                  "MeshdHighShedRate", "MeshdHedgeBudgetExhausted", "MeshdGpuEccErrors",
                  "MeshdGpuThermal", "MeshdCertificateExpiring"):
        assert f"alert: {alert}" in text, alert


def test_promtool_catches_a_broken_expression(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    text = RULES[0].read_text()
    bad.write_text(text.replace("max(meshd_gossip_members", "max(meshd_gossip_members(", 1))
    done = check(bad)
    assert done.returncode != 0 and "parse error" in (done.stdout + done.stderr).lower()
