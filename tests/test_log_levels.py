"""Log levels per layer, changed at runtime: the rules (meshd/logs.py) and the admin API on a
real two-node mesh (meshctl log-level, RBAC, bad input, the effect on the node's JSON log)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshd import logs


@pytest.fixture
def restore_levels() -> Iterator[None]:
    names = ["meshd", *(f"meshd.{layer}" for layer in logs.LAYERS)]
    before = {n: logging.getLogger(n).level for n in names}
    yield
    for n, level in before.items():
        logging.getLogger(n).setLevel(level)


def test_a_layer_has_its_own_level_until_it_is_given_back(restore_levels: None) -> None:
    logs.set_level("", "warning")
    logs.set_level("gossip", "debug")
    overall, layers = logs.levels()
    by = {name: (level, inherited) for name, level, inherited in layers}
    assert overall == "warning" and set(by) == set(logs.LAYERS)
    assert by["gossip"] == ("debug", False) and by["raft"] == ("warning", True)
    assert logging.getLogger("meshd.gossip").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("meshd.raft").isEnabledFor(logging.INFO)
    logs.set_level("gossip", "")
    assert dict((n, i) for n, _, i in logs.levels()[1])["gossip"] is True


@pytest.mark.parametrize(("layer", "level", "field"), [
    ("gosip", "debug", "layer: unknown layer 'gosip'"),
    ("gossip", "verbose", "level: must be one of debug, info, warning, error or ''"),
    ("", "", "level: must be one of debug, info, warning, error, got ''"),
    ("", "DEBUG", "level:"),
])
def test_bad_layers_and_levels_are_named(restore_levels: None, layer: str, level: str,
                                         field: str) -> None:
    with pytest.raises(ValueError, match=field.replace("(", r"\(")):
        logs.set_level(layer, level)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="needs Linux (one loopback address per node)")
def test_meshctl_sets_a_layers_level_on_a_live_node(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from meshd.ctl import main as ctl
    from proto.mesh.v1 import admin_pb2
    from testbed.cluster import Cluster, RpcFailed

    c = Cluster(2, tmp_path / "mesh")
    try:
        c.start()
        c.wait_converged(30)
        node = c.seed
        base = ["--admin", node.admin, "--creds", str(c.admin_creds)]
        assert not [e for e in node.logs() if e.get("level") == "debug"]
        capsys.readouterr()
        assert ctl.main([*base, "log-level", "agent", "debug"]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"{node.name}: info") and "agent      debug\n" in out, out
        assert "gossip     info (inherited)" in out
        # the agent logs its peers' node-state changes at debug: they appear now
        c.wait_for(lambda: [e for e in node.logs() if e.get("level") == "debug"
                            and e.get("logger") == "meshd.agent"], 30, "debug lines")
        assert [e for e in node.logs() if e.get("event") == "log_level_set"
                and e.get("layer") == "agent" and e.get("to") == "debug"]
        with pytest.raises(RpcFailed) as bad:
            c.client._call(node.admin, "SetLogLevel",
                           admin_pb2.SetLogLevelRequest(layer="agent", level="loud"), 5)
        assert bad.value.code == "INVALID_ARGUMENT" and "level:" in bad.value.details
        assert ctl.main([*base, "log-level", "agent", "inherit"]) == 0
        assert "agent      info (inherited)" in capsys.readouterr().out
        # another node keeps its own levels
        other = c.nodes[1]
        resp = c.client._call(other.admin, "LogLevels", admin_pb2.LogLevelsRequest(), 5)
        assert resp.node == other.name and resp.level == "info"
        assert all(x.inherited for x in resp.layers)
    finally:
        c.close()


@given(st.text(max_size=12), st.text(max_size=12))
@settings(max_examples=300, deadline=None)
def test_any_layer_and_level_is_taken_or_refused_by_name(layer: str, level: str) -> None:
    before = {n: logging.getLogger(n).level
              for n in ["meshd", *(f"meshd.{x}" for x in logs.LAYERS)]}
    try:
        logs.set_level(layer, level)
    except ValueError as exc:
        assert str(exc).startswith(("layer: ", "level: "))
        assert before == {n: logging.getLogger(n).level for n in before}  # nothing changed
    else:
        assert layer in ("", *logs.LAYERS) and level in ("", *logs.LEVELS)
    finally:
        for n, lv in before.items():
            logging.getLogger(n).setLevel(lv)
