"""Tests for policy/: kinds and validation, policy files, and the replicated store."""

from __future__ import annotations

import json
import math
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policy import (
    KINDS,
    Change,
    Document,
    GapError,
    PolicyError,
    PolicyStore,
    StoredDoc,
    defaults,
    dump_documents,
    parse_documents,
    schedulable,
    validate,
)
from policy.document import MAX_INPUT_BYTES
from policy.fields import MAX_INT, NAME_RE, TOKEN_RE
from policy.merge import merge_patch

FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def doc(kind: str, name: str = "x", **spec: Any) -> dict[str, Any]:
    return {"kind": kind, "name": name, "spec": spec}


def rejects(raw: object, field: str, fragment: str = "") -> PolicyError:
    with pytest.raises(PolicyError) as info:
        validate(raw)
    err = info.value
    assert err.field == field, str(err)
    assert str(err) == f"{err.field}: {err.message}"
    assert fragment in err.message, str(err)
    return err


# --- envelope -------------------------------------------------------------------------------

def test_envelope_normalizes_and_round_trips() -> None:
    d = validate({"kind": "NodeFlags", "name": "gpu-node-1", "version": 4, "spec": {}})
    assert d == Document("NodeFlags", "gpu-node-1",
                         {"cordoned": False, "draining": None, "quarantined": None})
    assert d.version == 4  # carried, but not part of equality or to_dict()
    assert d.to_dict() == {"kind": "NodeFlags", "name": "gpu-node-1", "spec": d.spec}
    assert validate(d.to_dict()) == d
    assert validate({"kind": "NodeFlags", "name": "n"}).spec["cordoned"] is False  # spec optional
    assert validate({"kind": "NodeFlags", "name": "n", "spec": None}).spec["cordoned"] is False


def test_to_dict_is_a_copy() -> None:
    d = validate(doc("ModelPin", nodes=["a"]))
    d.to_dict()["spec"]["nodes"].append("b")
    assert d.spec["nodes"] == ["a"]


@pytest.mark.parametrize("raw, field, fragment", [
    ([], "document", "must be an object"),
    ({"name": "x"}, "kind", "required"),
    ({"kind": "Nope", "name": "x"}, "kind", "unknown kind 'Nope'; expected one of NodeFlags"),
    ({"kind": 3, "name": "x"}, "kind", "unknown kind 3"),
    ({"kind": "NodeFlags"}, "name", "required"),
    ({"kind": "NodeFlags", "name": ""}, "name", "got ''"),
    ({"kind": "NodeFlags", "name": "-x"}, "name", "starts and ends"),
    ({"kind": "NodeFlags", "name": "x-"}, "name", "starts and ends"),
    ({"kind": "NodeFlags", "name": "a b"}, "name", "got 'a b'"),
    ({"kind": "NodeFlags", "name": "a\n"}, "name", ""),
    ({"kind": "NodeFlags", "name": "a" * 129}, "name", ""),
    ({"kind": "NodeFlags", "name": 42}, "name", "quote it in YAML"),
    ({"kind": "NodeFlags", "name": "x", "apiVersion": "v1"}, "apiVersion",
     "unknown field; expected one of kind, name, spec, version"),
    ({"kind": "NodeFlags", "name": "x", 1: 2}, "[1]", "field names must be strings"),
    ({"kind": "NodeFlags", "name": "x", "version": -1}, "version", "integer >= 0"),
    ({"kind": "NodeFlags", "name": "x", "version": True}, "version", "got true"),
    ({"kind": "NodeFlags", "name": "x", "spec": []}, "spec", "must be an object"),
])
def test_envelope_errors(raw: object, field: str, fragment: str) -> None:
    rejects(raw, field, fragment)


@pytest.mark.parametrize("name", ["resnet50", "llama-3.1-8b", "llama-3.1-8b:rev2", "a", "Node_7",
                                  "10.0.0.1", "a" * 128])
def test_good_names(name: str) -> None:
    assert validate({"kind": "ModelPin", "name": name}).name == name


# --- kinds ----------------------------------------------------------------------------------

REQUIRED: dict[str, dict[str, Any]] = {"SloClass": {"deadline_ms": 100},
                                       "TrainingPlacement": {"node": "n1"}}


def spec_of(kind: str, **fields: Any) -> dict[str, Any]:
    return validate(doc(kind, **{**REQUIRED.get(kind, {}), **fields})).spec


def test_defaults_of_every_kind() -> None:
    assert spec_of("NodeFlags") == {"cordoned": False, "draining": None, "quarantined": None}
    assert spec_of("TenantQuota") == {"requests_per_second": None, "burst": None,
                                      "concurrency": None, "priority": 5,
                                      "training_gpus": None}
    assert spec_of("SloClass") == {"deadline_ms": 100.0, "hedging": True,
                                   "hedge_after_ms": None, "shed_priority": 5}
    assert spec_of("ModelPin") == {"nodes": [], "zones": [], "gpu_types": [],
                                   "min_free_vram_mb": 0, "min_replicas": 0,
                                   "max_replicas": None, "config": ""}
    assert spec_of("HealthPolicy") == {
        "auto_quarantine": True, "ecc_uncorrected": 1, "thermal_seconds": 60.0,
        "failure_ratio": 0.5, "failure_min": 10, "failure_seconds": 30.0,
        "lift_after_seconds": 600.0}
    assert spec_of("TrainingPlacement") == {"node": "n1", "gpus": [], "vram_mb": 0,
                                            "state": "pending", "lease": None, "progress": 0.0,
                                                "parts": []}
    assert defaults("NodeFlags") == spec_of("NodeFlags")
    with pytest.raises(PolicyError):
        defaults("SloClass")  # deadline_ms is required


@pytest.mark.parametrize("kind, fields, expect", [
    ("NodeFlags", {"cordoned": True}, {"cordoned": True}),
    ("NodeFlags", {"draining": {"deadline_unix": 1_700_000_000}},
     {"draining": {"deadline_unix": 1_700_000_000.0}}),
    ("NodeFlags", {"quarantined": {"reason": "ECC errors on GPU 3"}},
     {"quarantined": {"reason": "ECC errors on GPU 3", "auto": False}}),
    ("TenantQuota", {"requests_per_second": 2.5, "burst": 10, "concurrency": 4, "priority": 9},
     {"requests_per_second": 2.5, "burst": 10, "concurrency": 4, "priority": 9}),
    ("TenantQuota", {"burst": 10.0, "priority": 0}, {"burst": 10, "priority": 0}),
    ("SloClass", {"deadline_ms": 3_600_000, "hedging": False, "hedge_after_ms": 20,
                  "shed_priority": 0},
     {"deadline_ms": 3_600_000.0, "hedging": False, "hedge_after_ms": 20.0, "shed_priority": 0}),
    ("ModelPin", {"nodes": ["n1", "n2"], "zones": ["us-east-1a"],
                  "gpu_types": ["A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"],
                  "min_free_vram_mb": 20_000, "min_replicas": 2, "max_replicas": 2},
     {"nodes": ["n1", "n2"], "zones": ["us-east-1a"],
      "gpu_types": ["A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"], "min_free_vram_mb": 20_000,
      "min_replicas": 2, "max_replicas": 2}),
    ("ModelPin", {"max_replicas": 8.0}, {"min_replicas": 0, "max_replicas": 8}),
    ("ModelPin", {"max_replicas": 0}, {"min_replicas": 0, "max_replicas": 0}),  # not served
    ("TrainingPlacement", {"gpus": ["0", "GPU-8f2c1e7a-aaaa-bbbb-cccc-0123456789ab",
                                    "MIG-GPU-8f2c1e7a/1/0"], "vram_mb": 40_000,
                           "state": "running", "progress": 1,
                           "lease": {"holder": "trainer@n1", "expires_unix": 1.5}},
     {"gpus": ["0", "GPU-8f2c1e7a-aaaa-bbbb-cccc-0123456789ab", "MIG-GPU-8f2c1e7a/1/0"],
      "vram_mb": 40_000, "state": "running", "progress": 1.0,
      "lease": {"holder": "trainer@n1", "expires_unix": 1.5}}),
])
def test_good_fields(kind: str, fields: dict[str, Any], expect: dict[str, Any]) -> None:
    spec = spec_of(kind, **fields)
    assert {k: spec[k] for k in expect} == expect
    assert validate(doc(kind, **spec)).spec == spec


BAD_FIELDS: list[tuple[str, dict[str, Any], str, str]] = [
    ("NodeFlags", {"cordoned": 1}, "spec.cordoned", "must be true or false, got 1"),
    ("NodeFlags", {"cordoned": "yes"}, "spec.cordoned", "got 'yes'"),
    ("NodeFlags", {"draining": True}, "spec.draining", "must be an object"),
    ("NodeFlags", {"draining": {}}, "spec.draining.deadline_unix", "required"),
    ("NodeFlags", {"draining": {"deadline_unix": 0}}, "spec.draining.deadline_unix", "> 0"),
    ("NodeFlags", {"draining": {"deadline_unix": 5, "grace": 1}}, "spec.draining.grace",
     "unknown field; expected one of deadline_unix"),
    ("NodeFlags", {"quarantined": {"reason": ""}}, "spec.quarantined.reason", "1..256"),
    ("NodeFlags", {"quarantined": {"reason": "r", "auto": 1}}, "spec.quarantined.auto",
     "true or false"),
    ("HealthPolicy", {"failure_ratio": 0}, "spec.failure_ratio", "> 0"),
    ("HealthPolicy", {"failure_ratio": 1.5}, "spec.failure_ratio", "<= 1"),
    ("HealthPolicy", {"ecc_uncorrected": 0}, "spec.ecc_uncorrected", ">= 1"),
    ("HealthPolicy", {"lift_after_seconds": -1}, "spec.lift_after_seconds", "> 0"),
    ("NodeFlags", {"quarantined": {"reason": "x" * 257}}, "spec.quarantined.reason", "1..256"),
    ("NodeFlags", {"quarantined": {"reason": "a\nb"}}, "spec.quarantined.reason", "control"),
    ("NodeFlags", {"quarantined": {"reason": " a"}}, "spec.quarantined.reason", "whitespace"),
    ("NodeFlags", {"quarantined": {"reason": "\ud800"}}, "spec.quarantined.reason", "control"),
    ("NodeFlags", {"foo": 1}, "spec.foo",
     "unknown field; expected one of cordoned, draining, quarantined"),
    ("TenantQuota", {"requests_per_second": -1}, "spec.requests_per_second",
     "must be a number > 0 or null, got -1"),
    ("TenantQuota", {"requests_per_second": 0}, "spec.requests_per_second", "got 0"),
    ("TenantQuota", {"requests_per_second": math.nan}, "spec.requests_per_second", "got nan"),
    ("TenantQuota", {"requests_per_second": math.inf}, "spec.requests_per_second", "got inf"),
    ("TenantQuota", {"requests_per_second": 10**400}, "spec.requests_per_second", "-bit integer"),
    ("TenantQuota", {"requests_per_second": True}, "spec.requests_per_second", "got true"),
    ("TenantQuota", {"requests_per_second": "5"}, "spec.requests_per_second", "got '5'"),
    ("TenantQuota", {"burst": 0}, "spec.burst", "integer >= 1"),
    ("TenantQuota", {"burst": 1.5}, "spec.burst", "got 1.5"),
    ("TenantQuota", {"burst": True}, "spec.burst", "got true"),
    ("TenantQuota", {"burst": 2**60}, "spec.burst", f"at most {MAX_INT}"),
    ("TenantQuota", {"concurrency": 0}, "spec.concurrency", "integer >= 1"),
    ("TenantQuota", {"priority": 10}, "spec.priority", "integer in 0..9, got 10"),
    ("TenantQuota", {"priority": None}, "spec.priority", "got null"),
    ("SloClass", {"deadline_ms": None}, "spec.deadline_ms", "got null"),
    ("SloClass", {"deadline_ms": 0}, "spec.deadline_ms", "> 0 and <= 3600000"),
    ("SloClass", {"deadline_ms": 3_600_001}, "spec.deadline_ms", "got 3600001"),
    ("SloClass", {"hedging": "false"}, "spec.hedging", "true or false"),
    ("SloClass", {"hedge_after_ms": 100}, "spec.hedge_after_ms", "must be < deadline_ms (100)"),
    ("SloClass", {"hedge_after_ms": -5}, "spec.hedge_after_ms", "> 0"),
    ("SloClass", {"shed_priority": -1}, "spec.shed_priority", "0..9"),
    ("ModelPin", {"nodes": "n1"}, "spec.nodes", "must be a list"),
    ("ModelPin", {"nodes": ["n1", "bad name"]}, "spec.nodes[1]", "got 'bad name'"),
    ("ModelPin", {"nodes": ["n1", "n2", "n1"]}, "spec.nodes[2]", "duplicate of spec.nodes[0]"),
    ("ModelPin", {"nodes": [f"n{i}" for i in range(257)]}, "spec.nodes", "at most 256 items"),
    ("ModelPin", {"zones": ["a", 5]}, "spec.zones[1]", "got 5"),
    ("ModelPin", {"zones": ["z" * 65]}, "spec.zones[0]", "1..64"),
    ("ModelPin", {"gpu_types": ["A100", "A100"]}, "spec.gpu_types[1]", "duplicate"),
    ("ModelPin", {"min_free_vram_mb": -1}, "spec.min_free_vram_mb", "integer >= 0"),
    ("ModelPin", {"min_replicas": 1.5}, "spec.min_replicas", "got 1.5"),
    ("ModelPin", {"max_replicas": True}, "spec.max_replicas", "got true"),
    ("ModelPin", {"min_replicas": 3, "max_replicas": 2}, "spec.max_replicas",
     "must be >= min_replicas (3), got 2"),
    ("TrainingPlacement", {"node": None}, "spec.node", "got null"),
    ("TrainingPlacement", {"gpus": ["0", "0"]}, "spec.gpus[1]", "duplicate"),
    ("TrainingPlacement", {"gpus": [0]}, "spec.gpus[0]", "quote it in YAML"),
    ("TrainingPlacement", {"gpus": ["/dev/nvidia0"]}, "spec.gpus[0]", "GPU UUID or index"),
    ("TrainingPlacement", {"vram_mb": -5}, "spec.vram_mb", "integer >= 0"),
    ("TrainingPlacement", {"state": "paused"}, "spec.state",
     "one of 'pending', 'running', 'done', 'failed'"),
    ("TrainingPlacement", {"lease": {"holder": "t"}}, "spec.lease.expires_unix", "required"),
    ("TrainingPlacement", {"lease": {"holder": "", "expires_unix": 1}}, "spec.lease.holder", ""),
    ("TrainingPlacement", {"progress": 1.01}, "spec.progress", ">= 0 and <= 1"),
    ("TrainingPlacement", {"progress": -0.1}, "spec.progress", "got -0.1"),
]


@pytest.mark.parametrize("kind, fields, field, fragment", BAD_FIELDS)
def test_bad_fields(kind: str, fields: dict[str, Any], field: str, fragment: str) -> None:
    rejects(doc(kind, **{**REQUIRED.get(kind, {}), **fields}), field, fragment)


def test_required_fields() -> None:
    rejects(doc("SloClass"), "spec.deadline_ms", "required")
    rejects(doc("TrainingPlacement"), "spec.node", "required")


def test_schedulable() -> None:
    assert schedulable(defaults("NodeFlags"))
    assert not schedulable(spec_of("NodeFlags", cordoned=True))
    assert not schedulable(spec_of("NodeFlags", draining={"deadline_unix": 1}))
    assert not schedulable(spec_of("NodeFlags", quarantined={"reason": "bad"}))


def test_kinds_are_grouped() -> None:
    assert set(KINDS.values()) == {"policy", "placements"}
    assert KINDS["TrainingPlacement"] == "placements"


def test_hostile_nesting_and_values() -> None:
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    rejects(doc("NodeFlags", cordoned=deep), "spec.cordoned", "a list of 1 items")
    rejects(doc("ModelPin", zones=deep), "spec.zones[0]", "a list of 1 items")
    loop: list[Any] = []
    loop.append(loop)
    rejects(doc("ModelPin", nodes=loop), "spec.nodes[0]", "")
    rejects(doc("NodeFlags", cordoned=object()), "spec.cordoned", "type object")
    rejects({"kind": "NodeFlags", "name": "x" * 1_000_000}, "name", "...'")


# --- property tests: validation ---------------------------------------------------------------

SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(min_value=2**60)
           | st.floats() | st.text(max_size=8) | st.sampled_from(["", "x", "NodeFlags", "n1"]))
KEYS = (st.text(max_size=6) | st.integers() | st.booleans() | st.none() | st.floats()
        | st.sampled_from(["kind", "name", "spec", "version", "cordoned", "deadline_ms"]))
JSONISH = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(KEYS, inner, max_size=4), max_leaves=25)

NAMES = st.from_regex(NAME_RE, fullmatch=True)
TEXT = st.text(st.characters(categories=["L", "N", "P", "S"], include_characters=" "),
               min_size=1, max_size=20).filter(lambda t: t == t.strip())
POSITIVE = (st.floats(min_value=0, max_value=1e12, exclude_min=True)
            | st.integers(min_value=1, max_value=10**9))
COUNT = st.integers(min_value=0, max_value=MAX_INT)


def _opt(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


@st.composite
def slo_specs(draw: st.DrawFn) -> dict[str, Any]:
    deadline = draw(st.floats(min_value=0.001, max_value=3_600_000))
    spec = draw(_opt(hedging=st.booleans(), shed_priority=st.integers(0, 9)))
    spec["deadline_ms"] = deadline
    if draw(st.booleans()):
        spec["hedge_after_ms"] = draw(st.none() | st.floats(min_value=0, max_value=deadline,
                                                            exclude_min=True, exclude_max=True))
    return spec


SPEC_STRATEGIES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "NodeFlags": _opt(
        cordoned=st.booleans(),
        draining=st.none() | st.fixed_dictionaries({"deadline_unix": POSITIVE}),
        quarantined=st.none() | st.fixed_dictionaries({"reason": TEXT})),
    "TenantQuota": _opt(
        requests_per_second=st.none() | POSITIVE,
        burst=st.none() | st.integers(1, 10**6), concurrency=st.none() | st.integers(1, 10**6),
        priority=st.integers(0, 9)),
    "SloClass": slo_specs(),
    "ModelPin": _opt(
        nodes=st.lists(NAMES, unique=True, max_size=4),
        zones=st.lists(TEXT, unique=True, max_size=4),
        gpu_types=st.lists(TEXT, unique=True, max_size=4),
        min_free_vram_mb=COUNT, min_replicas=COUNT),
    "TrainingPlacement": st.fixed_dictionaries({"node": NAMES}, optional={
        "gpus": st.lists(st.from_regex(TOKEN_RE, fullmatch=True), unique=True, max_size=4),
        "vram_mb": COUNT,
        "state": st.sampled_from(["pending", "running", "done", "failed"]),
        "lease": st.none() | st.fixed_dictionaries({"holder": TEXT, "expires_unix": POSITIVE}),
        "progress": st.floats(0, 1)}),
}


ALL_KINDS = st.sampled_from(sorted(SPEC_STRATEGIES))


def valid_docs(names: st.SearchStrategy[str] = NAMES,
               kinds: st.SearchStrategy[str] = ALL_KINDS,
               ) -> st.SearchStrategy[dict[str, Any]]:
    return kinds.flatmap(
        lambda kind: st.fixed_dictionaries({"kind": st.just(kind), "name": names,
                                            "spec": SPEC_STRATEGIES[kind]}))


@st.composite
def mutated_docs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid document with one field (envelope or spec) replaced, removed or added."""
    raw = draw(valid_docs())
    target: dict[Any, Any] = raw if draw(st.booleans()) else raw["spec"]
    key = draw(st.sampled_from(sorted(target) or ["spec"]) | KEYS)
    action = draw(st.sampled_from(["replace", "delete"]))
    if action == "delete":
        target.pop(key, None)
    else:
        target[key] = draw(JSONISH)
    return raw


def validate_or_error(raw: object) -> Document | None:
    try:
        return validate(raw)
    except PolicyError as err:
        assert str(err).startswith(f"{err.field}: ")
        return None


@FAST
@given(JSONISH | st.dictionaries(st.sampled_from(["kind", "name", "spec"]), JSONISH))
def test_random_values_only_raise_policy_error(raw: object) -> None:
    validate_or_error(raw)


@FAST
@given(mutated_docs())
def test_mutated_documents_only_raise_policy_error(raw: dict[str, Any]) -> None:
    d = validate_or_error(raw)
    if d is not None:
        assert validate(d.to_dict()) == d


@FAST
@given(valid_docs())
def test_valid_documents_normalize_idempotently(raw: dict[str, Any]) -> None:
    d = validate(raw)
    again = validate(d.to_dict())
    assert again == d and again.to_dict() == d.to_dict()
    json.dumps(d.to_dict(), allow_nan=False)  # plain, finite data
    assert msgpack.unpackb(msgpack.packb(d.to_dict())) == d.to_dict()


# --- policy files -----------------------------------------------------------------------------

YAML_TWO = """\
kind: NodeFlags
name: n1
spec:
  cordoned: true
---
---
kind: SloClass
name: interactive
version: 3
spec:
  deadline_ms: 250
  hedge_after_ms: 40
"""


def test_yaml_multi_document() -> None:
    docs = parse_documents(YAML_TWO, "p.yaml")
    assert [d.key for d in docs] == [("NodeFlags", "n1"), ("SloClass", "interactive")]
    assert docs[0].spec["cordoned"] is True
    assert docs[1].spec["deadline_ms"] == 250.0 and docs[1].version == 3


def test_json_object_and_list() -> None:
    one = parse_documents('{"kind": "ModelPin", "name": "resnet50", "spec": {"zones": ["a"]}}')
    assert one[0].spec["zones"] == ["a"]
    many = parse_documents(json.dumps([doc("NodeFlags", "a"), doc("NodeFlags", "b")]))
    assert [d.name for d in many] == ["a", "b"]
    assert parse_documents("") == [] and parse_documents("---\n---\n") == []


def test_errors_are_prefixed_by_position() -> None:
    bad = YAML_TWO.replace("deadline_ms: 250", "deadline_ms: -1")
    with pytest.raises(PolicyError) as info:
        parse_documents(bad)
    assert info.value.field == "documents[1].spec.deadline_ms"
    with pytest.raises(PolicyError) as info:
        parse_documents("kind: SloClass\nname: a\nspec: {deadline_ms: -1}\n")
    assert info.value.field == "spec.deadline_ms"  # a single document needs no position
    with pytest.raises(PolicyError) as info:
        parse_documents(json.dumps([doc("NodeFlags", "a"), 5]))
    assert str(info.value).startswith("documents[1].document: must be an object")


def test_duplicate_documents_rejected() -> None:
    with pytest.raises(PolicyError) as info:
        parse_documents(json.dumps([doc("NodeFlags", "a"), doc("NodeFlags", "a")]))
    assert info.value.field == "documents[1].name"


@pytest.mark.parametrize("text, fragment", [
    ("kind: NodeFlags\nname: [n1\n", "invalid YAML at line 3, column 1"),
    ("kind: NodeFlags\n  name: x\n", "invalid YAML at line 2, column 7"),
    ('{"kind": "NodeFlags",\n "name": }', "invalid JSON at line 2, column 10"),
    ('{"kind": "NodeFlags", "kind": "SloClass"}', "duplicate key 'kind'"),
    ("kind: NodeFlags\nname: a\nname: b\n", "line 3, column 1: found duplicate key 'name'"),
    ("!!python/object/apply:os.system ['true']", "could not determine a constructor"),
    ("[" * 200_000, "nested too deeply"),
    ("a: " + "[" * 200_000, "nested too deeply"),
    ("burst: " + "9" * 5000, "invalid YAML"),
    ('{"burst": ' + "9" * 5000 + "}", "invalid JSON"),
])
def test_syntax_errors(text: str, fragment: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_documents(text, "p.yaml")
    assert info.value.field == "p.yaml"
    assert fragment in info.value.message


def test_size_limit() -> None:
    with pytest.raises(PolicyError, match="limit is 1048576"):
        parse_documents("#" * (MAX_INPUT_BYTES + 1))


def test_yaml_anchors_and_merge_keys_still_work() -> None:
    text = ("- kind: SloClass\n  name: a\n  spec: &base {deadline_ms: 100}\n"
            "- kind: SloClass\n  name: b\n  spec:\n    <<: *base\n    hedging: false\n")
    a, b = parse_documents(text)
    assert b.spec == {**a.spec, "hedging": False}


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_dump_round_trip(fmt: Any) -> None:
    store = PolicyStore()
    store.apply({"op": "put", "doc": doc("SloClass", "a", deadline_ms=5, hedge_after_ms=1)})
    store.apply({"op": "put", "doc": doc("ModelPin", "llama-3.1-8b:rev2", zones=["é zone"])})
    text = dump_documents([s.to_manifest() for s in store.list()], fmt)
    back = parse_documents(text)
    assert back == [s.document for s in store.list()]
    assert [d.version for d in back] == [2, 1]
    assert dump_documents([], "yaml") == "" and json.loads(dump_documents([], "json")) == []
    with pytest.raises(ValueError):
        dump_documents([], "toml")  # type: ignore[arg-type]


@FAST
@given(st.text(max_size=200) | JSONISH.map(lambda v: json.dumps(v)))
def test_parse_only_raises_policy_error(text: str) -> None:
    try:
        parse_documents(text)
    except PolicyError:
        pass


# --- store: commands --------------------------------------------------------------------------

def put(d: dict[str, Any], if_version: int | None = None, at: float = 0.0,
        author: str = "") -> dict[str, Any]:
    return {"op": "put", "doc": d, "if_version": if_version, "author": author, "at": at}


def patch(kind: str, name: str, spec: object, if_version: int | None = None) -> dict[str, Any]:
    return {"op": "patch", "kind": kind, "name": name, "spec": spec, "if_version": if_version,
            "author": "op", "at": 2.0}


def delete(kind: str, name: str, if_version: int | None = None) -> dict[str, Any]:
    return {"op": "delete", "kind": kind, "name": name, "if_version": if_version}


def test_put_versions_and_metadata() -> None:
    s = PolicyStore()
    assert s.version == 0
    assert s.apply(put(doc("SloClass", "a", deadline_ms=10), at=5.0, author="alice")) == {
        "ok": True, "version": 1, "created": True}
    assert s.apply(put(doc("NodeFlags", "n1"))) == {"ok": True, "version": 2, "created": True}
    assert s.apply(put(doc("SloClass", "a", deadline_ms=20), at=6.0, author="bob")) == {
        "ok": True, "version": 3, "created": False}
    stored = s.get("SloClass", "a")
    assert stored is not None
    assert stored.to_dict() == {
        "kind": "SloClass", "name": "a", "spec": spec_of("SloClass", deadline_ms=20),
        "version": 3, "created_version": 1, "updated_unix": 6.0, "author": "bob"}
    assert StoredDoc.from_dict(stored.to_dict()) == stored
    assert stored.to_manifest() == {"kind": "SloClass", "name": "a", "version": 3,
                                    "spec": stored.document.spec}
    assert [x.document.key for x in s.list()] == [("NodeFlags", "n1"), ("SloClass", "a")]
    assert [x.document.name for x in s.list("SloClass")] == ["a"]
    assert s.get("SloClass", "missing") is None


def test_if_version() -> None:
    s = PolicyStore()
    d = doc("NodeFlags", "n1")
    assert s.apply(put(d, if_version=3)) == {
        "ok": False, "error": "conflict", "current": 0,
        "message": "NodeFlags n1 was expected to be at version 3 but does not exist"}
    assert s.apply(put(d, if_version=0))["ok"]
    res = s.apply(put(d, if_version=0))
    assert res["error"] == "conflict" and res["current"] == 1
    assert s.apply(put(d, if_version=1))["version"] == 2
    assert s.apply(put(d, if_version=1))["current"] == 2
    assert s.apply(put(d))["version"] == 3  # unconditional
    assert s.version == 3


def test_invalid_commands_change_nothing() -> None:
    s = PolicyStore()
    res = s.apply(put(doc("SloClass", "a", deadline_ms=-1)))
    assert res == {"ok": False, "error": "invalid", "field": "doc.spec.deadline_ms",
                   "message": "doc.spec.deadline_ms: must be a number > 0 and <= 3600000, "
                              "got -1"}
    bads: list[Any] = [None, [], "put", {}, {"op": "nope"}, {"op": "noop", "x": 1},
                {"op": "put"}, {"op": "put", "doc": 5}, put(doc("NodeFlags", "n"), if_version=-1),
                put(doc("NodeFlags", "n"), if_version=True), {**put(doc("NodeFlags", "n")),
                                                               "at": math.nan},
                {"op": "read", "kind": "Nope", "name": "a"}, patch("NodeFlags", "a", [1]),
                delete("NodeFlags", "bad name")]
    for bad in bads:
        res = s.apply(bad)
        assert res["ok"] is False and res["error"] == "invalid", (bad, res)
        assert isinstance(res["message"], str) and isinstance(res["field"], str)
    assert s.version == 0 and s.list() == []


def test_wrong_group() -> None:
    policy = PolicyStore(kinds=[k for k, g in KINDS.items() if g == "policy"])
    placements = PolicyStore(kinds=["TrainingPlacement"])
    job = doc("TrainingPlacement", "job-1", node="n1")
    res = policy.apply(put(job))
    assert res["ok"] is False and res["error"] == "wrong_group" and res["group"] == "placements"
    assert policy.apply(delete("TrainingPlacement", "job-1"))["error"] == "wrong_group"
    assert placements.apply(put(job))["ok"]
    assert placements.apply(patch("NodeFlags", "n1", {"cordoned": True}))["error"] == "wrong_group"
    with pytest.raises(ValueError):
        PolicyStore(kinds=["Nope"])
    with pytest.raises(ValueError):
        placements.node_flags("n1")


def test_patch_merges_concurrent_flags() -> None:
    s = PolicyStore()
    assert s.node_flags("n1") == defaults("NodeFlags")
    assert s.apply(patch("NodeFlags", "n1", {"cordoned": True})) == {
        "ok": True, "version": 1, "created": True}
    s.apply(patch("NodeFlags", "n1", {"draining": {"deadline_unix": 100}}))
    assert s.node_flags("n1") == {"cordoned": True, "draining": {"deadline_unix": 100.0},
                                  "quarantined": None}
    s.apply(patch("NodeFlags", "n1", {"cordoned": None}))  # null = back to the default
    assert s.node_flags("n1")["cordoned"] is False
    assert s.node_flags("n1")["draining"] == {"deadline_unix": 100.0}
    res = s.apply(patch("NodeFlags", "n1", {"draining": {"deadline_unix": -1}}))
    assert res["field"] == "spec.draining.deadline_unix"
    assert s.apply(patch("NodeFlags", "n1", {"cordoned": True}, if_version=1))["error"] == \
        "conflict"
    assert s.apply(patch("NodeFlags", "n1", {"cordoned": True}, if_version=3))["ok"]
    assert s.apply(patch("SloClass", "x", {"hedging": False}))["field"] == "spec.deadline_ms"
    flags = s.node_flags("n1")
    flags["cordoned"] = "mutated"
    assert s.node_flags("n1")["cordoned"] is True  # a copy


def test_merge_patch_rfc7386() -> None:
    target = {"a": "b", "c": {"d": "e", "f": "g"}}
    assert merge_patch(target, {"a": "z", "c": {"f": None}}) == {"a": "z", "c": {"d": "e"}}
    assert target == {"a": "b", "c": {"d": "e", "f": "g"}}  # untouched
    assert merge_patch({"a": [1]}, {"a": [2]}) == {"a": [2]}
    assert merge_patch({"a": 1}, {"b": {"c": None}}) == {"a": 1, "b": {}}
    assert merge_patch({"a": 1}, [1]) == [1]
    deep: dict[str, Any] = {}
    for _ in range(1000):
        deep = {"a": deep}
    with pytest.raises(PolicyError, match="nested more than"):
        merge_patch({}, deep)
    assert PolicyStore().apply(patch("NodeFlags", "n", deep))["error"] == "invalid"


def test_delete() -> None:
    s = PolicyStore()
    assert s.apply(delete("NodeFlags", "n1"))["error"] == "not_found"
    s.apply(put(doc("NodeFlags", "n1")))
    assert s.apply(delete("NodeFlags", "n1", if_version=0))["current"] == 1
    assert s.apply(delete("NodeFlags", "n1", if_version=2))["error"] == "conflict"
    assert s.apply(delete("NodeFlags", "n1", if_version=1)) == {"ok": True, "version": 2}
    assert s.get("NodeFlags", "n1") is None and s.version == 2
    assert s.apply(put(doc("NodeFlags", "n1")))["created"]
    assert s.get("NodeFlags", "n1").created_version == 3  # type: ignore[union-attr]


def test_read_and_noop_change_nothing() -> None:
    s = PolicyStore()
    assert s.apply({"op": "noop"}) == {"ok": True, "version": 0}
    assert s.apply({"op": "read", "kind": "NodeFlags", "name": "n"}) == {
        "ok": True, "doc": None, "version": 0}
    s.apply(put(doc("NodeFlags", "n", cordoned=True)))
    res = s.apply({"op": "read", "kind": "NodeFlags", "name": "n"})
    assert res["doc"]["spec"]["cordoned"] is True and res["version"] == 1
    res["doc"]["spec"]["cordoned"] = False  # results are copies
    assert s.node_flags("n")["cordoned"] is True
    assert s.version == 1 and len(s.changes_since(0) or []) == 1


def test_history_bound_and_changes_since() -> None:
    s = PolicyStore(history=3)
    for i in range(5):
        s.apply(put(doc("NodeFlags", f"n{i}")))
    assert s.changes_since(0) is None and s.changes_since(1) is None
    assert [c.version for c in s.changes_since(2) or []] == [3, 4, 5]
    assert [c.version for c in s.changes_since(4) or []] == [5]
    assert s.changes_since(5) == [] and s.changes_since(9) == []
    with pytest.raises(ValueError):
        s.changes_since(-1)
    s.apply(delete("NodeFlags", "n0"))
    last = (s.changes_since(5) or [])[0]
    assert last.op == "delete" and last.doc is None and last.name == "n0"
    assert PolicyStore(history=0).changes_since(0) == []


def test_follow_and_gap() -> None:
    leader, replica = PolicyStore(), PolicyStore()
    for i in range(4):
        leader.apply(put(doc("NodeFlags", f"n{i}")))
    leader.apply(delete("NodeFlags", "n1"))
    changes = leader.changes_since(0) or []
    with pytest.raises(GapError):
        replica.follow(changes[1])
    for c in changes[:3]:
        replica.follow(Change.from_dict(msgpack.unpackb(msgpack.packb(c.to_dict()))))
    replica.follow(changes[0])  # duplicate: ignored
    for c in changes[3:]:
        replica.follow(c)
    assert replica.list() == leader.list() and replica.version == leader.version
    assert replica.snapshot() == leader.snapshot()
    other = PolicyStore(kinds=["SloClass"])
    with pytest.raises(PolicyError):
        other.follow(changes[0])


def test_change_from_dict_rejects_inconsistency() -> None:
    s = PolicyStore()
    s.apply(put(doc("NodeFlags", "n")))
    good = (s.changes_since(0) or [])[0].to_dict()
    assert Change.from_dict(good) == (s.changes_since(0) or [])[0]
    for bad, field in [
        ({**good, "version": 2}, "change.doc.version"),
        ({**good, "name": "m"}, "change.doc"),
        ({**good, "op": "delete"}, "change.doc"),
        ({**good, "op": "delete", "doc": None, "kind": "Nope"}, "change.kind"),
        ({**good, "doc": {**good["doc"], "spec": {"cordoned": 1}}}, "change.doc.spec.cordoned"),
        ({**good, "doc": {**good["doc"], "created_version": 9}}, "change.doc.created_version"),
        ({**good, "extra": 1}, "change.extra"),
        ("nope", "change"),
    ]:
        with pytest.raises(PolicyError) as info:
            Change.from_dict(bad)
        assert info.value.field == field, str(info.value)


def test_snapshot_restore_and_load() -> None:
    s = PolicyStore(history=2)
    s.apply(put(doc("SloClass", "a", deadline_ms=10), at=1.0, author="a"))
    s.apply(patch("NodeFlags", "n", {"cordoned": True}))
    s.apply(put(doc("TrainingPlacement", "j", node="n", gpus=["0"])))
    s.apply(delete("SloClass", "a"))
    snap = s.snapshot()
    json.dumps(snap, allow_nan=False)
    wire = msgpack.unpackb(msgpack.packb(snap))
    r = PolicyStore.restore(wire)
    assert r.snapshot() == snap and r.list() == s.list() and r.version == 4
    assert r.changes_since(1) is None and [c.version for c in r.changes_since(2) or []] == [3, 4]
    # load keeps the target's kinds and history limit, and replaces everything else
    t = PolicyStore(history=1)
    t.apply(put(doc("NodeFlags", "other")))
    t.load(snap)
    assert t.list() == s.list() and t.version == 4 and t.history_limit == 1
    assert [c.version for c in t.changes_since(3) or []] == [4]
    with pytest.raises(PolicyError):
        PolicyStore(kinds=["NodeFlags"]).load(snap)  # holds a TrainingPlacement


def _corrupt(snap: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(snap))
    target = data
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    return data


@pytest.mark.parametrize("path, value, field", [
    (["format"], 2, "snapshot.format"),
    (["version"], -1, "snapshot.version"),
    (["version"], 9, "snapshot.history[0].version"),
    (["kinds"], ["Nope"], "snapshot.kinds"),
    (["docs"], {}, "snapshot.docs"),
    (["docs", 0, "spec", "cordoned"], "yes", "snapshot.docs[0].spec.cordoned"),
    (["docs", 0, "version"], 7, "snapshot.docs[0].version"),
    (["docs", 1], None, "snapshot.docs[1]"),
    (["history", 0, "version"], 5, "snapshot.history[0].doc.version"),
    (["history", 0, "doc", "version"], 5, "snapshot.history[0].doc.version"),
    (["history", 1, "doc", "author"], "mallory", "snapshot.history"),
    (["history", 1, "op"], "delete", "snapshot.history[1].doc"),
    (["extra"], 1, "snapshot.extra"),
])
def test_restore_rejects_corrupt_snapshots(path: list[Any], value: Any, field: str) -> None:
    s = PolicyStore()
    s.apply(put(doc("NodeFlags", "a")))
    s.apply(put(doc("NodeFlags", "b")))
    with pytest.raises(PolicyError) as info:
        PolicyStore.restore(_corrupt(s.snapshot(), path, value))
    assert info.value.field == field, str(info.value)
    with pytest.raises(PolicyError):
        PolicyStore.restore([1, 2])


def test_truncated_history_is_a_valid_snapshot() -> None:
    s = PolicyStore()
    s.apply(put(doc("NodeFlags", "a")))
    s.apply(put(doc("NodeFlags", "b")))
    snap = s.snapshot()
    keeps: list[list[Any]] = [snap["history"][1:], []]
    for keep in keeps:
        r = PolicyStore.restore({**snap, "history": keep})
        assert r.list() == s.list() and r.changes_since(0) is None
    with pytest.raises(PolicyError, match="no change for NodeFlags b"):
        forged = {**snap["history"][1], "op": "delete", "name": "c", "doc": None}
        PolicyStore.restore({**snap, "history": [forged]})


def test_duplicate_doc_in_snapshot() -> None:
    s = PolicyStore(history=0)
    s.apply(put(doc("NodeFlags", "a")))
    snap = s.snapshot()
    snap["docs"].append(snap["docs"][0])
    with pytest.raises(PolicyError, match="duplicate"):
        PolicyStore.restore(snap)


# --- property tests: the state machine --------------------------------------------------------

POOL = st.sampled_from(["a", "b", "n1"])
POOL_KINDS = st.sampled_from(["NodeFlags", "NodeFlags", "SloClass", "TenantQuota", "ModelPin",
                              "TrainingPlacement"])
IF_VERSION = st.none() | st.none() | st.integers(0, 8) | JSONISH
META = _opt(if_version=IF_VERSION, author=st.sampled_from(["", "alice", "bob"]),
            at=st.floats(0, 2e9))


@st.composite
def patch_commands(draw: st.DrawFn) -> dict[str, Any]:
    """A merge patch of some fields of a valid spec, some set to null, maybe one junk field."""
    kind = draw(POOL_KINDS)
    spec = draw(SPEC_STRATEGIES[kind])
    keys = draw(st.lists(st.sampled_from(sorted(spec) or ["cordoned"]), unique=True))
    changes: dict[Any, Any] = {k: None if draw(st.integers(0, 3)) == 0 else spec.get(k)
                               for k in keys}
    if draw(st.integers(0, 5)) == 0:
        changes[draw(KEYS)] = draw(JSONISH)
    return {"op": "patch", "kind": kind, "name": draw(POOL), "spec": changes, **draw(META)}


def _with_meta(command: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    return META.map(lambda meta: {**command, **meta})


VALID_PUTS = st.builds(lambda d: {"op": "put", "doc": d}, valid_docs(POOL, POOL_KINDS)) \
    .flatmap(_with_meta)
COMMANDS = st.one_of(
    VALID_PUTS, VALID_PUTS,
    st.builds(lambda d: {"op": "put", "doc": d}, mutated_docs()).flatmap(_with_meta),
    patch_commands(), patch_commands(),
    st.builds(lambda k, n: {"op": "delete", "kind": k, "name": n}, POOL_KINDS, POOL)
    .flatmap(_with_meta),
    st.fixed_dictionaries({"op": st.just("read"), "kind": POOL_KINDS, "name": POOL}),
    st.just({"op": "noop"}),
    JSONISH,
    st.dictionaries(st.sampled_from(["op", "kind", "name", "doc", "spec", "if_version", "at"]),
                    st.sampled_from(["put", "patch", "delete", "NodeFlags", "a"]) | JSONISH),
)


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.lists(COMMANDS, min_size=10, max_size=40))
def test_random_command_sequences(commands: list[Any]) -> None:
    store, twin = PolicyStore(), PolicyStore()
    small = PolicyStore(kinds=["NodeFlags", "SloClass"], history=3)
    for command in commands:
        before = store.version
        result = store.apply(command)
        assert twin.apply(command) == result  # deterministic
        small.apply(command)  # never raises either
        assert isinstance(result, dict) and isinstance(result["ok"], bool)
        json.dumps(result, allow_nan=False)
        mutating = isinstance(command, dict) and command.get("op") in ("put", "patch", "delete")
        if result["ok"] and mutating:
            assert store.version == before + 1 == result["version"]
        else:
            assert store.version == before
            if not result["ok"]:
                assert result["error"] in ("invalid", "conflict", "not_found", "wrong_group")
    assert store.snapshot() == twin.snapshot()

    replica = PolicyStore()
    for change in store.changes_since(0) or []:
        replica.follow(change)
    assert replica.list() == store.list() and replica.version == store.version

    snap = store.snapshot()
    restored = PolicyStore.restore(msgpack.unpackb(msgpack.packb(snap)))
    assert restored.snapshot() == snap and restored.list() == store.list()
    small_snap = small.snapshot()
    assert PolicyStore.restore(small_snap).snapshot() == small_snap

    # a replica that missed the truncated history catches up from a snapshot, then follows
    changes = small.changes_since(0)
    if changes is None:
        late = PolicyStore(kinds=small.kinds, history=3)
        late.load(small_snap)
        assert late.list() == small.list()
    else:
        assert [c.version for c in changes] == list(range(1, small.version + 1))


def test_command_formats_newer_than_this_build_are_refused_the_same_everywhere() -> None:
    from meshd.train.board import PlacementStore
    from policy.store import COMMAND_VERSION, PolicyStore

    for store in (PolicyStore(), PlacementStore()):
        doc = {"kind": "TenantQuota", "name": "a", "spec": {"requests_per_second": 1}}
        assert store.apply({"op": "put", "doc": doc, "v": 1})["ok"]  # format 1, said or not
        for bad, why in (({"v": COMMAND_VERSION + 1}, "newer than this coordinator's"),
                         ({"v": 0}, "format >= 1"), ({"v": True}, "format >= 1")):
            got = store.apply({"op": "put", "doc": doc, **bad})
            assert got["ok"] is False and got["field"] == "v" and why in got["message"], got
        assert store.version == 1
