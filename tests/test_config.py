"""Configuration profiles (memberlist's Default{LAN,WAN,Local}Config) and validation."""

import dataclasses

import pytest

from gossip import codec
from gossip.config import Config

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
