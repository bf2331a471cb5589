"""Configuration profiles (memberlist's Default{LAN,WAN,Local}Config) and validation; the
agent's settings for the dev router and certificate names."""

import dataclasses
import ipaddress
import socket
from pathlib import Path

import pytest

from certs.names import MAX_NAMES
from gossip import codec
from gossip.config import Config
from meshd import settings as settings_mod
from meshd.settings import SettingsError, load

# Values from hashicorp/memberlist config.go, in seconds.
MEMBERLIST_LAN = dict(
    tcp_timeout=10.0, indirect_checks=3, retransmit_mult=4, suspicion_mult=4,
    suspicion_max_timeout_mult=6, push_pull_interval=30.0, probe_timeout=0.5,
    probe_interval=1.0, awareness_max_multiplier=8, gossip_nodes=3, gossip_interval=0.2,
    gossip_to_the_dead_time=30.0, packet_size=1400, dead_node_reclaim_time=0.0,
)
MEMBERLIST_WAN = dict(
    MEMBERLIST_LAN, tcp_timeout=30.0, suspicion_mult=6, push_pull_interval=60.0,
    probe_timeout=3.0, probe_interval=5.0, gossip_nodes=4, gossip_interval=0.5,
    gossip_to_the_dead_time=60.0,
)
MEMBERLIST_LOCAL = dict(
    MEMBERLIST_LAN, tcp_timeout=1.0, indirect_checks=1, retransmit_mult=2, suspicion_mult=3,
    push_pull_interval=15.0, probe_timeout=0.2, probe_interval=1.0, gossip_interval=0.1,
    gossip_to_the_dead_time=15.0,
)


@pytest.mark.parametrize(("cfg", "expected", "profile"), [
    (Config.lan(), MEMBERLIST_LAN, "lan"),
    (Config.wan(), MEMBERLIST_WAN, "wan"),
    (Config.local(), MEMBERLIST_LOCAL, "local"),
    (Config(), MEMBERLIST_LAN, "lan"),
])
def test_profiles_match_memberlist(cfg: Config, expected: dict, profile: str) -> None:
    assert cfg.profile == profile
    assert {k: getattr(cfg, k) for k in expected} == expected
    assert cfg.nacks is True  # Lifeguard on by default
    cfg.validate()


def test_profiles_differ_only_where_memberlist_does() -> None:
    lan = dataclasses.asdict(Config.lan())
    for cfg, expected in ((Config.wan(), MEMBERLIST_WAN), (Config.local(), MEMBERLIST_LOCAL)):
        other = dataclasses.asdict(cfg)
        changed = {k for k in lan if lan[k] != other[k]} - {"profile"}
        assert changed == {k for k in expected if expected[k] != MEMBERLIST_LAN[k]}


@pytest.mark.parametrize("name", ["lan", "wan", "local"])
def test_profile_named(name: str) -> None:
    assert Config.profile_named(name) == getattr(Config, name)()
    cfg = Config.profile_named(name, gossip_nodes=7)
    assert cfg.gossip_nodes == 7 and cfg.profile == name


def test_unknown_profile() -> None:
    with pytest.raises(ValueError, match=r"unknown profile 'lab'.*\['lan', 'local', 'wan'\]"):
        Config.profile_named("lab")


def test_overrides_and_replace() -> None:
    cfg = Config.wan(probe_interval=10.0)
    assert cfg.probe_interval == 10.0 and cfg.probe_timeout == 3.0
    again = cfg.replace(gossip_nodes=5)
    assert again.gossip_nodes == 5 and cfg.gossip_nodes == 4  # frozen: a copy
    assert cfg.replace() is cfg
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.gossip_nodes = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        Config.lan(no_such_field=1)


def test_without_lifeguard() -> None:
    plain = Config.lan().without_lifeguard()
    assert plain.suspicion_max_timeout_mult == 1
    assert plain.awareness_max_multiplier == 1
    assert plain.nacks is False
    # Everything else is untouched.
    base = dataclasses.asdict(Config.lan())
    diff = {k for k, v in dataclasses.asdict(plain).items() if base[k] != v}
    assert diff == {"suspicion_max_timeout_mult", "awareness_max_multiplier", "nacks"}
    assert Config.wan().without_lifeguard().profile == "wan"


@pytest.mark.parametrize(("overrides", "field"), [
    (dict(probe_interval=0), "probe_interval"),
    (dict(probe_interval=-1.0), "probe_interval"),
    (dict(probe_timeout=0), "probe_timeout"),
    (dict(gossip_interval=0), "gossip_interval"),
    (dict(tcp_timeout=-0.5), "tcp_timeout"),
    (dict(probe_timeout=2.0), "probe_timeout"),  # exceeds probe_interval
    (dict(retransmit_mult=0), "retransmit_mult"),
    (dict(suspicion_mult=0), "suspicion_mult"),
    (dict(suspicion_max_timeout_mult=0), "suspicion_max_timeout_mult"),
    (dict(awareness_max_multiplier=0), "awareness_max_multiplier"),
    (dict(indirect_checks=-1), "indirect_checks"),
    (dict(gossip_nodes=-1), "gossip_nodes"),
    (dict(push_pull_interval=-1.0), "push_pull_interval"),
    (dict(packet_size=575), "packet_size"),
    (dict(packet_size=65001), "packet_size"),
    (dict(gossip_to_the_dead_time=-1.0), "gossip_to_the_dead_time"),
    (dict(dead_node_reclaim_time=-1.0), "dead_node_reclaim_time"),
    (dict(reap_time=-1.0), "reap_time"),
    (dict(leave_propagate_delay=-1.0), "leave_propagate_delay"),
    (dict(max_meta_bytes=codec.MAX_META + 1), "max_meta_bytes"),
    (dict(max_meta_bytes=-1), "max_meta_bytes"),
    (dict(max_state_bytes=codec.MAX_BLOB + 1), "max_state_bytes"),
    (dict(max_stream_bytes=0), "max_stream_bytes"),
])
def test_validate_names_the_field(overrides: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Config.lan(**overrides)
    # The constructor itself does not validate, but validate() (which Swim calls) does.
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(Config.lan(), **overrides).validate()


@pytest.mark.parametrize("overrides", [
    dict(indirect_checks=0), dict(gossip_nodes=0), dict(push_pull_interval=0.0),
    dict(probe_timeout=1.0), dict(packet_size=576), dict(packet_size=65000),
    dict(suspicion_max_timeout_mult=1), dict(awareness_max_multiplier=1),
    dict(max_meta_bytes=codec.MAX_META), dict(max_state_bytes=codec.MAX_BLOB),
    dict(reap_time=0.0), dict(leave_propagate_delay=0.0),
])
def test_validate_accepts_boundaries(overrides: dict) -> None:
    Config.lan(**overrides).validate()


def test_defaults_fit_the_wire_format() -> None:
    cfg = Config.lan()
    assert cfg.max_meta_bytes <= codec.MAX_META
    assert cfg.max_state_bytes <= codec.MAX_BLOB
    # A state delta small enough for the broadcast queue fits in one packet with room to spare.
    assert cfg.max_state_delta_bytes + 200 < cfg.packet_size


# --- meshd settings: the --dev router stays on loopback; certificate names --------------------


def test_dev_router_defaults_to_loopback() -> None:
    assert load(["--node", "a", "--dev"], {}).router_addr() == ("127.0.0.1", 9000)
    assert load(["--node", "a", "--dev", "--bind", "10.0.0.5:7946"], {}).router_addr() == (
        "127.0.0.1", 9000)
    assert load(["--node", "a", "--dev", "--bind", "127.0.0.3:7946"], {}).router_addr() == (
        "127.0.0.3", 9000)
    # outside --dev (TLS) the default stays every address
    assert load(["--node", "a"], {}).router_addr() == ("0.0.0.0", 9000)
    assert load(["--node", "a", "--bind", "127.0.0.3:7946"], {}).router_addr() == (
        "127.0.0.3", 9000)


@pytest.mark.parametrize("router", ["0.0.0.0:9000", "10.0.0.5:9000", "[::]:9000",
                                    "gpu17.example.com:9000"])
def test_dev_router_off_loopback_is_refused(router: str) -> None:
    with pytest.raises(SettingsError, match=r"router: .* is not a loopback address, and with "
                                            r"--dev the router is plaintext.*without --dev"):
        load(["--node", "a", "--dev", "--role", "router", "--router", router], {})
    with pytest.raises(SettingsError, match="plaintext"):
        load([], {"MESHD_NODE": "a", "MESHD_DEV": "1", "MESHD_ROUTER": router})
    assert load(["--node", "a", "--role", "router", "--router", router], {}).router


@pytest.mark.parametrize("router", ["127.0.0.1:9500", "127.0.0.4:9000", "[::1]:9000",
                                    "localhost:9000"])
def test_dev_router_on_loopback_is_fine(router: str) -> None:
    s = load(["--node", "a", "--dev", "--role", "router", "--router", router], {})
    assert s.router_addr()[1] in (9000, 9500)


def test_cert_san_from_flags_env_and_file(tmp_path: Path) -> None:
    s = load(["--node", "a", "--cert-san", "lb.example.com,10.0.0.9", "--cert-san", "[::2]"], {})
    assert s.cert_san == ["lb.example.com", "10.0.0.9", "[::2]"]
    assert load(["--node", "a"], {"MESHD_CERT_SAN": "x.example, 10.1.1.1"}).cert_san == [
        "x.example", "10.1.1.1"]
    conf = tmp_path / "meshd.toml"
    conf.write_text('node = "a"\ncert-san = ["lb.example.com", "192.0.2.7"]\n')
    assert load(["--config", str(conf)], {}).cert_san == ["lb.example.com", "192.0.2.7"]
    for bad, why in (("*.example.com", "wildcard"), ("bad_name.example", "label"),
                     ("0.0.0.0", "unspecified"), ("fe80::1%eth0", "zone")):
        with pytest.raises(SettingsError, match=f"cert_san: .*{why}"):
            load(["--node", "a", "--cert-san", bad], {})
    with pytest.raises(SettingsError, match="cert_san: 33 names, at most 32"):
        load(["--node", "a", "--cert-san", ",".join(f"h{i}.example" for i in range(33))], {})


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu17")
    monkeypatch.setattr(settings_mod, "host_addresses", lambda: ["10.0.0.5", "2001:db8::5"])


def names(argv: list[str]) -> list[str]:
    return load(["--node", "a", *argv], {}).cert_names()


@pytest.mark.usefixtures("host")
def test_cert_names_follow_the_addresses_listened_on() -> None:
    # loopback (dev): the loopback addresses, localhost and the host name
    assert names(["--dev", "--bind", "127.0.0.1:7946", "--role", "router"]) == [
        "127.0.0.1", "::1", "localhost", "gpu17"]
    assert names(["--dev", "--bind", "127.0.0.3:7946", "--cert-san", "lb.example"]) == [
        "lb.example", "127.0.0.3", "127.0.0.1", "::1", "localhost", "gpu17"]
    # specific addresses: those, and the host name
    assert names(["--bind", "10.0.0.5:7946", "--advertise", "203.0.113.9", "--role",
                  "router", "--router", "10.0.0.5:9000"]) == [
        "10.0.0.5", "203.0.113.9", "gpu17"]
    # a router on every address: the host's addresses, loopback included
    assert names(["--bind", "10.0.0.7:7946", "--role", "router"]) == [
        "10.0.0.7", "127.0.0.1", "::1", "localhost", "gpu17", "10.0.0.5", "2001:db8::5"]
    assert names([]) == ["127.0.0.1", "::1", "localhost", "gpu17", "10.0.0.5", "2001:db8::5"]
    # the router's address counts only where a router is served
    assert "10.0.0.8" not in names(["--bind", "10.0.0.5:7946", "--router", "10.0.0.8:9000"])
    assert "10.0.0.8" in names(["--bind", "10.0.0.5:7946", "--router", "10.0.0.8:9000",
                                "--role", "router"])


def test_cert_names_skip_what_a_certificate_cannot_carry_and_stay_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "My_Host")
    monkeypatch.setattr(settings_mod, "host_addresses",
                        lambda: [f"10.0.{i // 250}.{i % 250 + 1}" for i in range(100)])
    got = names(["--cert-san", "LB.Example.com", "--role", "router"])
    assert got[:4] == ["lb.example.com", "127.0.0.1", "::1", "localhost"]
    assert "My_Host" not in got and "my_host" not in got
    assert len(got) == MAX_NAMES


def test_host_addresses_leave_out_loopback_and_link_local(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def getaddrinfo(host: str, *args: object, **kwargs: object) -> list[tuple[object, ...]]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0))
                for a in ("127.0.1.1", "10.2.3.4", "169.254.1.1", "10.2.3.4")]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    got = settings_mod.host_addresses()
    assert got[0] == "10.2.3.4" and got.count("10.2.3.4") == 1
    for text in got:
        addr = ipaddress.ip_address(text)
        assert not (addr.is_loopback or addr.is_link_local or addr.is_unspecified)
