"""Job specs: defaults, the size estimate, and rejections that name the field."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshd.train.spec import BYTES_PER_SECOND, DEFAULT_WORK_SECONDS, parse_job
from policy.errors import PolicyError

GOOD = {"id": "ft-1", "model": "llama-3.1-8b",
        "command": ["torchrun", "--nproc-per-node", "2", "train.py"]}


def test_a_minimal_spec_gets_every_default() -> None:
    job = parse_job(GOOD)
    assert job.id == "ft-1"
    assert job.doc["gpus"] == {"count": 1, "min_free_vram_mb": 0, "type": "", "nodes": 0}
    assert (job.doc["tenant"], job.doc["priority"], job.doc["on_drain"]) == ("default", 5,
                                                                             "finish")
    assert job.work_seconds() == DEFAULT_WORK_SECONDS
    assert parse_job(job.doc).doc == job.doc  # normalizing twice changes nothing


def test_the_size_estimate_prefers_the_hint_then_the_data_size() -> None:
    assert parse_job({**GOOD, "data_bytes": 10 * int(BYTES_PER_SECOND)}).work_seconds() == 10.0
    job = parse_job({**GOOD, "data_bytes": 10**12, "work_seconds": 90,
                     "gpus": {"count": 4, "min_free_vram_mb": 20_000, "type": "A100"},
                     "zones": ["eu-1"]})
    needs = job.needs()
    assert (needs.gpus, needs.work_s, needs.min_free_vram_mb, needs.gpu_type, needs.zones) == (
        4, 90.0, 20_000, "A100", ("eu-1",))
    assert parse_job({**GOOD, "gpus": {"count": 0}}).needs().gpus == 1  # a CPU slot


@pytest.mark.parametrize(("patch", "field"), [
    ({"id": "bad id"}, "id"),
    ({"model": None}, "model"),
    ({"gpus": {"count": -1}}, "gpus.count"),
    ({"gpus": {"count": 1000}}, "gpus.count"),
    ({"gpus": {"cnt": 1}}, "gpus.cnt"),
    ({"command": ["ok", "bad\nline"]}, "command[1]"),
    ({"command": [], "entry": None}, "command"),
    ({"entry": "pkg.mod:fit"}, "command"),  # both
    ({"command": [], "entry": "pkg mod"}, "entry"),
    ({"priority": 10}, "priority"),
    ({"work_seconds": 0}, "work_seconds"),
    ({"hyperparameters": {"lr": float("nan")}}, "hyperparameters.lr"),
    ({"hyperparameters": {"layers": [1, 2]}}, "hyperparameters.layers"),
    ({"env": {"1BAD": "x"}}, "env"),
    ({"zones": ["a", "a"]}, "zones[1]"),
    ({"on_drain": "pause"}, "on_drain"),
    ({"colour": "red"}, "colour"),
])
def test_a_bad_spec_is_rejected_naming_the_field(patch: dict, field: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_job({**GOOD, **patch})
    assert err.value.field == field, str(err.value)


def test_an_entry_point_job_and_its_hyperparameters() -> None:
    job = parse_job({"id": "j", "model": "m", "entry": "meshd.jobs.logreg:main",
                     "hyperparameters": {"lr": 0.1, "epochs": 3, "opt": "sgd", "amp": False},
                     "env": {"OMP_NUM_THREADS": "2"}})
    assert job.doc["command"] == [] and job.doc["entry"] == "meshd.jobs.logreg:main"
    assert job.doc["hyperparameters"]["epochs"] == 3


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=12))
@settings(max_examples=300, deadline=None)
def test_any_input_is_a_spec_or_a_policy_error(raw: object) -> None:
    for doc in (raw, {**GOOD, "gpus": raw}, {**GOOD, "hyperparameters": raw},
                {**GOOD, "command": raw}):
        try:
            parse_job(doc)
        except PolicyError:
            pass
