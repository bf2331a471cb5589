"""The health monitor (automatic quarantine), driven with simulated time and telemetry."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.model import GpuState, ReplicaState
from meshd.control.health import (
    MAX_HOLD,
    HealthMonitor,
    HealthRules,
    Lift,
    Problem,
    Quarantine,
    reason_text,
)
from meshd.signals.wire import NodeSignals
from policy.model import validate

AUTO: dict[str, Any] = {"reason": "auto: x", "auto": True}
OPERATOR: dict[str, Any] = {"reason": "disk replaced", "auto": False}


def gpu(ecc: int | None = 0, throttle: tuple[str, ...] = (), uuid: str = "GPU-1") -> GpuState:
    return GpuState(uuid, 0, "A100", 80 << 30, 40 << 30, ecc_uncorrected=ecc,
                    throttle=throttle, at=1.0)


def node(*gpus: GpuState, replicas: tuple[ReplicaState, ...] = ()) -> NodeSignals:
    return NodeSignals(epoch=1, seq=1, gpus=list(gpus), replicas=list(replicas))


def replica(at: float, failures: int, rate: float, model: str = "m") -> ReplicaState:
    return ReplicaState(model, "1", "127.0.0.1:8001", ready=True, failures=failures, rate=rate,
                        at={"stats": at})


def test_a_healthy_node_does_nothing() -> None:
    mon = HealthMonitor()
    for t in range(100):
        assert mon.step(float(t), node(gpu(0, ("sw_power_cap",))), HealthRules(), None) is None
    assert mon.current == []


def test_an_uncorrected_ecc_error_quarantines_at_once_and_names_the_gpu() -> None:
    mon = HealthMonitor()
    assert mon.step(0.0, node(gpu(0)), HealthRules(), None) is None
    action = mon.step(1.0, node(gpu(1)), HealthRules(), None)
    assert isinstance(action, Quarantine)
    assert action.reason == "auto: 1 uncorrected ECC error on GPU 0 (GPU-1)"
    assert [p.cause for p in action.problems] == ["ecc"]
    # Until the flags show the write, the same decision comes back (a failed write is retried).
    assert isinstance(mon.step(2.0, node(gpu(1)), HealthRules(), None), Quarantine)
    # Written: nothing more to do while the errors are there (never lifted while unhealthy).
    for t in range(3, 2000, 50):
        assert mon.step(float(t), node(gpu(1)), HealthRules(), AUTO) is None


def test_a_threshold_counts_errors_per_gpu() -> None:
    mon = HealthMonitor()
    rules = HealthRules(ecc_uncorrected=3)
    assert mon.step(0.0, node(gpu(2)), rules, None) is None
    assert isinstance(mon.step(1.0, node(gpu(3)), rules, None), Quarantine)


def test_an_operator_lifting_acknowledges_the_errors_seen_and_new_ones_count_again() -> None:
    mon = HealthMonitor()
    assert isinstance(mon.step(0.0, node(gpu(2)), HealthRules(), None), Quarantine)
    assert mon.step(1.0, node(gpu(2)), HealthRules(), AUTO) is None
    assert mon.step(2.0, node(gpu(2)), HealthRules(), None) is None  # the operator lifted it
    assert mon.ecc_acknowledged == {"GPU-1": 2}
    assert mon.step(3.0, node(gpu(2)), HealthRules(), None) is None
    again = mon.step(4.0, node(gpu(3)), HealthRules(), None)
    assert isinstance(again, Quarantine) and "1 uncorrected ECC error " in again.reason


def test_acknowledged_errors_survive_a_restart_and_a_driver_reload_resets_them() -> None:
    mon = HealthMonitor({"GPU-1": 2})  # what the shell loaded from health.json
    assert mon.step(0.0, node(gpu(2)), HealthRules(), None) is None
    assert mon.step(1.0, node(gpu(0)), HealthRules(), None) is None  # counters restarted
    assert mon.ecc_acknowledged == {}
    assert isinstance(mon.step(2.0, node(gpu(1)), HealthRules(), None), Quarantine)


def test_thermal_throttling_must_last_without_a_break() -> None:
    mon = HealthMonitor()
    rules = HealthRules(thermal_seconds=60)
    hot = node(gpu(0, ("hw_thermal",)))
    for t in range(0, 60):
        assert mon.step(float(t), hot, rules, None) is None
    assert mon.step(60.0, node(gpu(0)), rules, None) is None  # a break: the clock restarts
    for t in range(61, 121):
        assert mon.step(float(t), hot, rules, None) is None
    action = mon.step(121.0, hot, rules, None)
    assert isinstance(action, Quarantine)
    assert action.problems[0].cause == "thermal" and "hw_thermal" in action.reason
    assert "for 60s" in action.reason


def test_a_gpu_without_readings_is_not_throttling() -> None:
    mon = HealthMonitor()
    rules = HealthRules(thermal_seconds=10)
    mon.step(0.0, node(gpu(0, ("sw_thermal",))), rules, None)
    mon.step(5.0, node(), rules, None)  # the GPU vanished from the readings
    assert mon.step(12.0, node(gpu(0, ("sw_thermal",))), rules, None) is None


def failing_run(mon: HealthMonitor, start: float, seconds: int, failures: int, rate: float,
                rules: HealthRules, flags: dict[str, Any] | None = None) -> list[object]:
    """One statistics sample a second, as the Triton adapter makes them."""
    return [mon.step(start + t, node(replicas=(replica(start + t, failures, rate),)), rules,
                     flags) for t in range(seconds)]


def test_a_runtime_that_keeps_failing_is_quarantined() -> None:
    mon = HealthMonitor()
    rules = HealthRules(failure_min=10, failure_ratio=0.5, failure_seconds=30)
    # 2 failures and 1 success a second; the first sample only opens the interval, so the
    # 10th failure counted is in the sixth sample.
    actions = failing_run(mon, 0.0, 8, failures=2, rate=1.0, rules=rules)
    first = next(i for i, a in enumerate(actions) if a is not None)
    assert first == 5
    action = actions[first]
    assert isinstance(action, Quarantine) and action.problems[0].subject == "127.0.0.1:8001"
    assert "failed in the last 30s" in action.reason


def test_failures_under_the_ratio_are_not_a_failing_runtime() -> None:
    mon = HealthMonitor()
    rules = HealthRules(failure_min=10, failure_ratio=0.5, failure_seconds=30)
    assert all(a is None for a in failing_run(mon, 0.0, 60, failures=2, rate=10.0, rules=rules))


def test_each_statistics_sample_counts_once() -> None:
    mon = HealthMonitor()
    rules = HealthRules(failure_min=3, failure_seconds=30)
    same = node(replicas=(replica(5.0, 2, 0.0),))
    for t in range(10):
        assert mon.step(5.0 + t, same, rules, None) is None  # one sample, seen ten times


def test_an_automatic_quarantine_is_lifted_after_a_healthy_period_doubling_on_repeats() -> None:
    mon = HealthMonitor()
    rules = HealthRules(failure_min=3, failure_seconds=10, lift_after_seconds=100)
    assert any(isinstance(a, Quarantine) for a in failing_run(mon, 0.0, 5, 3, 0.0, rules))
    # Quarantined: traffic stops, the failures age out of the window, then 100 s of health.
    healthy = failing_run(mon, 5.0, 200, 0, 0.0, rules, AUTO)
    lift_at = 5 + next(i for i, a in enumerate(healthy) if a is not None)
    assert isinstance(healthy[lift_at - 5], Lift)
    assert 100 + 10 <= lift_at <= 100 + 16  # the window empties after ~10 s, then 100 s
    assert mon.strikes == 1
    # It fails again as soon as traffic returns: the next hold is twice as long.
    t = float(lift_at + 1)
    failing_run(mon, t, 2, 0, 0.0, rules)  # flags show the lift
    assert any(isinstance(a, Quarantine) for a in failing_run(mon, t + 2, 5, 3, 0.0, rules))
    healthy = failing_run(mon, t + 7, 400, 0, 0.0, rules, AUTO)
    second = next(i for i, a in enumerate(healthy) if a is not None)
    assert mon.strikes == 2 and mon.hold(rules) == 200
    assert 200 <= second <= 200 + 16


def test_strikes_are_forgotten_after_a_long_time_in_service() -> None:
    mon = HealthMonitor()
    rules = HealthRules(lift_after_seconds=10)
    mon.step(0.0, node(), rules, AUTO)
    assert mon.strikes == 1
    mon.step(20.0, node(), rules, None)
    mon.step(21.0, node(), rules, AUTO)
    assert mon.strikes == 2
    mon.step(40.0, node(), rules, None)
    mon.step(40.0 + 4 * 20 + 1, node(), rules, AUTO)  # in service longer than 4 holds
    assert mon.strikes == 1


def test_the_hold_is_capped_at_a_day() -> None:
    mon = HealthMonitor()
    mon.strikes = 40
    assert mon.hold(HealthRules(lift_after_seconds=600)) == MAX_HOLD


def test_an_operators_quarantine_is_never_lifted_by_the_monitor() -> None:
    mon = HealthMonitor()
    for t in range(0, 100_000, 500):
        assert mon.step(float(t), node(gpu(0)), HealthRules(lift_after_seconds=1), OPERATOR) \
            is None


def test_policy_can_turn_quarantine_and_lifting_off() -> None:
    mon = HealthMonitor()
    assert mon.step(0.0, node(gpu(5)), HealthRules(auto_quarantine=False), None) is None
    assert mon.current and mon.current[0].cause == "ecc"  # still seen (and in metrics)
    mon = HealthMonitor()
    never = HealthRules(lift_after_seconds=None)
    for t in range(0, 200_000, 1000):
        assert mon.step(float(t), node(gpu(0)), never, AUTO) is None


def test_several_problems_make_one_reason_that_fits_the_policy_field() -> None:
    problems = [Problem("ecc", f"GPU-{i}", f"{i} uncorrected ECC errors on GPU {i} (GPU-{i})")
                for i in range(30)]
    reason = reason_text(problems)
    assert len(reason) == 256 and reason.endswith("...")
    validate({"kind": "NodeFlags", "name": "n1",
              "spec": {"quarantined": {"reason": reason, "auto": True}}})


@pytest.mark.parametrize("spec", [
    {},
    {"auto_quarantine": False, "ecc_uncorrected": 2, "thermal_seconds": 5.0,
     "failure_ratio": 0.9, "failure_min": 1, "failure_seconds": 3.0, "lift_after_seconds": None},
])
def test_rules_come_from_a_validated_health_policy(spec: dict[str, Any]) -> None:
    doc = validate({"kind": "HealthPolicy", "name": "default", "spec": spec})
    rules = HealthRules.from_spec(doc.spec)
    assert rules == HealthRules(**spec)
