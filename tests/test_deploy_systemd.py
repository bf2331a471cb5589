"""deploy/systemd: the units pass ``systemd-analyze verify`` with no warning, their hardening
keeps systemd's exposure score low, and the example settings load as meshd loads them."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from meshd import settings

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "deploy" / "systemd"
MAX_EXPOSURE = 2.5
"""systemd-analyze security's 0-10 exposure; ours are 2.0 (agent) and 1.7 (coordinator)."""

needs_systemd = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                   reason="needs systemd-analyze (Debian's systemd package)")


def _unit(name: str, tmp: Path) -> Path:
    """The unit, with ExecStart pointing at this checkout's meshd (verify checks it exists)."""
    meshd = Path(sys.executable).with_name("meshd")
    text = (UNITS / name).read_text().replace("/usr/local/bin/meshd", str(meshd))
    out = tmp / name
    out.write_text(text)
    return out


@needs_systemd
@pytest.mark.parametrize("name", ["meshd-agent.service", "meshd-coordinator.service"])
def test_units_verify_cleanly_and_are_hardened(name: str, tmp_path: Path) -> None:
    unit = _unit(name, tmp_path)
    verify = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                            capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0 and not verify.stderr.strip(), verify.stderr
    security = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)],
                              capture_output=True, text=True, timeout=60)
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", security.stdout)
    assert found, security.stdout[-2000:] + security.stderr
    assert float(found.group(1)) <= MAX_EXPOSURE, security.stdout[-3000:]


@needs_systemd
def test_verify_does_catch_a_bad_unit(tmp_path: Path) -> None:
    """The check above means something: a typo in a hardening option is reported."""
    unit = _unit("meshd-agent.service", tmp_path)
    unit.write_text(unit.read_text().replace("ProtectSystem=strict", "ProtectSystem=strikt"))
    verify = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                            capture_output=True, text=True, timeout=60)
    assert "ProtectSystem" in verify.stderr or "protect system" in verify.stderr


@pytest.mark.parametrize(("unit", "config", "roles"), [
    ("meshd-agent.service", "agent.toml", ["gpu", "router"]),
    ("meshd-coordinator.service", "coordinator.toml", ["coordinator"]),
])
def test_the_example_settings_load_as_meshd_loads_them(unit: str, config: str,
                                                       roles: list[str]) -> None:
    assert f"--config /etc/meshd/{config}" in (UNITS / unit).read_text()
    s = settings.load(["--config", str(UNITS / config)], environ={})
    assert s.roles == roles and s.data_dir == "/var/lib/meshd" and len(s.join) == 3
