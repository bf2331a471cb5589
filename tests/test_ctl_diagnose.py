"""meshctl tells a refused certificate from a dead node: on UNAVAILABLE it checks its own
certificate, the connection and a TLS handshake of its own, and says which failed.  Against a
real admin server (in process, real mTLS)."""

from __future__ import annotations

import asyncio
import datetime as dt
import shutil
import time
from pathlib import Path

import pytest

from certs.ca import CertificateAuthority
from certs.spiffe import SpiffeId
from gossip.config import Config
from gossip.protocol import Swim
from gossip.state import NodeMeta
from meshd.coordinates import CoordinatePlane
from meshd.ctl import main as ctl
from meshd.ctl.diagnose import explain
from meshd.dev.ports import free_port
from testbed.admin import dev_security, start_admin


def test_meshctl_says_why_the_admin_api_did_not_answer(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sec = dev_security(tmp_path / "a", "a")
    ca = sec.ca
    assert ca is not None
    stranger_ca = CertificateAuthority.create("mesh.test")

    def mint(name: str, authority: CertificateAuthority, **kw: object) -> Path:
        out = tmp_path / f"id-{name}"
        authority.mint(SpiffeId("mesh.test", "user", name), ["admin"],
                       **kw).save(out)  # type: ignore[arg-type]
        return out

    # A certificate of another CA that trusts this mesh's: the server is the one to refuse it.
    foreign = mint("eve", stranger_ca)
    shutil.copy(tmp_path / "a" / "meshctl" / "bundle.pem", foreign / "bundle.pem")
    # ... and one that trusts only its own CA: we refuse the server first.
    elsewhere = mint("mallory", stranger_ca)
    expired = mint("old", ca, lifetime=dt.timedelta(hours=1), now=time.time() - 7200)
    good = tmp_path / "a" / "meshctl"

    async def scenario() -> dict[str, str | None]:
        swim = Swim(Config.local(), "a", ("127.0.0.1", 7000), NodeMeta.build([], "", "", {}, {}),
                    now=0.0)
        port = free_port()
        server = await start_admin(swim, lambda: 0.0, CoordinatePlane("a", place_of=lambda n: None),
                                   sec, port)
        target = f"127.0.0.1:{port}"
        loop = asyncio.get_running_loop()
        try:
            out = {name: await loop.run_in_executor(None, explain, target, creds)
                   for name, creds in (("good", good), ("foreign", foreign),
                                       ("elsewhere", elsewhere), ("expired", expired))}
            out["cli"] = str(await loop.run_in_executor(None, ctl.main, [
                "--admin", target, "--creds", str(foreign), "members"]))
        finally:
            await server.stop(0)
        out["down"] = explain(target, good)
        return out

    got = asyncio.run(scenario())
    assert got["good"] is None
    assert got["foreign"] is not None and got["foreign"].startswith(
        f"the server refused our certificate ({foreign}): ")
    assert got["elsewhere"] is not None and "the server's certificate is not from this mesh's CA" \
        in got["elsewhere"]
    assert got["expired"] is not None and "expired at" in got["expired"]
    assert got["down"] is not None and got["down"].startswith("nothing accepts connections")
    err = capsys.readouterr().err
    assert got["cli"] == "1" and "meshctl: UNAVAILABLE" in err
    assert "meshctl: the server refused our certificate" in err
