"""The GPU adapter: CPU-only mode against the real pynvml, every field against a fake NVML."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pynvml
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.gpu import GpuAdapter, NvmlReader, error_reason, text, throttle_names
from adapters.model import GpuState, MigProfile
from tests.fake_nvml import (
    FakeGpu,
    FakeMig,
    FakeNvml,
    FunctionNotFound,
    GiB,
    GpuIsLost,
    LibraryNotFound,
    NoPermission,
    NotSupported,
    Unknown,
)

MIG_ON = pynvml.NVML_DEVICE_MIG_ENABLE


@pytest.fixture
def gpu_log() -> Iterator[list[logging.LogRecord]]:
    """Records of the adapter's logger, whatever another test did to the ``meshd`` logger."""
    logger = logging.getLogger("meshd.adapters.gpu")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler, level = Keep(logging.DEBUG), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


def events(records: list[logging.LogRecord], event: str) -> list[logging.LogRecord]:
    return [r for r in records if getattr(r, "event", None) == event]


def read_one(gpu: FakeGpu) -> tuple[NvmlReader, list[GpuState]]:
    reader = NvmlReader(FakeNvml([gpu]))
    assert reader.open() is None
    return reader, reader.read(now=12.5)


# --- CPU-only ---------------------------------------------------------------------------------


def test_real_pynvml_without_driver_is_cpu_only(gpu_log: list[logging.LogRecord]) -> None:
    """This machine has no NVIDIA driver: the real nvmlInit fails and the agent carries on."""
    adapter = GpuAdapter(interval=0.01)

    async def scenario() -> None:
        await adapter.start()
        try:
            if not adapter.cpu_only:
                pytest.skip("an NVIDIA driver is present; CPU-only mode is covered by the fake")
            await asyncio.sleep(0.05)  # no polling loop would run in this time either
        finally:
            await adapter.close()

    asyncio.run(scenario())
    assert adapter.reason is not None and adapter.reason.startswith("NVML unavailable: ")
    assert len(adapter.reason) > len("NVML unavailable: ")
    assert adapter.gpus == {} and adapter.polls == 0 and not adapter.errors
    assert len(gpu_log) == 1
    (record,) = gpu_log
    assert record.levelno == logging.INFO
    assert getattr(record, "event", None) == "gpu_cpu_only"
    assert getattr(record, "detail", None) == adapter.reason


def test_library_not_found_reason_and_one_log_line(gpu_log: list[logging.LogRecord]) -> None:
    fake = FakeNvml([FakeGpu()], init_error=LibraryNotFound)
    adapter = GpuAdapter(interval=0.001, reader=NvmlReader(fake))

    async def scenario() -> None:
        await adapter.start()
        await asyncio.sleep(0.05)
        await adapter.close()

    asyncio.run(scenario())
    assert adapter.cpu_only
    assert adapter.reason == "NVML unavailable: NVML Shared Library Not Found"
    assert [r.getMessage() for r in gpu_log] == [
        "no GPU telemetry, running CPU-only: NVML unavailable: NVML Shared Library Not Found"]
    assert dict(fake.calls) == {"nvmlInit": 1}  # nothing polled, nothing shut down


def test_driver_without_gpus_is_cpu_only() -> None:
    fake = FakeNvml([])
    reader = NvmlReader(fake)
    assert reader.open() == "NVML found no GPUs"
    assert fake.refcount == 0  # NVML was shut down again


def test_missing_pynvml_module_is_cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    reason = NvmlReader().open()
    assert reason is not None and reason.startswith("NVML unavailable: cannot import pynvml")


def test_real_driver_reads_gpus() -> None:
    """On a machine with an NVIDIA driver, the real path reads at least one GPU."""
    reader = NvmlReader()
    reason = reader.open()
    if reason is not None:
        pytest.skip(f"no NVIDIA driver: {reason}")
    try:
        gpus = reader.read(now=1.0)
    finally:
        reader.close()
    assert gpus, f"NVML counted GPUs but none could be read: {reader.failures}"
    assert all(g.memory_total > 0 and g.uuid for g in gpus)
    assert any(g.memory_total > 0 for g in gpus)


# --- the reader against the fake --------------------------------------------------------------


def test_every_field_mapped_and_converted() -> None:
    gpu = FakeGpu(uuid="GPU-aaaa", name="NVIDIA H100 80GB HBM3", memory_total=80 * GiB,
                  memory_free=30 * GiB, gpu_util=97, mem_util=41, temperature=71,
                  power_mw=612_345, ecc_uncorrected=2, ecc_corrected=17, clock_reasons=0x44)
    reader, gpus = read_one(gpu)
    assert gpus == [GpuState(
        uuid="GPU-aaaa", index=0, name="NVIDIA H100 80GB HBM3",
        memory_total=80 * GiB, memory_free=30 * GiB, sm_util=97.0, mem_util=41.0,
        temperature_c=71.0, power_w=612.345, ecc_uncorrected=2, ecc_corrected=17,
        throttle=("sw_power_cap", "hw_thermal"), mig=(), at=12.5)]
    assert reader.failures == {} and not reader.field_errors


def test_several_gpus_keep_their_index() -> None:
    fake = FakeNvml([FakeGpu(uuid=f"GPU-{i}") for i in range(4)])
    reader = NvmlReader(fake)
    assert reader.open() is None
    assert [(g.index, g.uuid) for g in reader.read(0.0)] == [(i, f"GPU-{i}") for i in range(4)]


@pytest.mark.parametrize(("bits", "names"), [
    (0, ()),
    (0x1 | 0x2 | 0x10 | 0x100, ()),  # idle, application clocks, sync boost, display clock
    (0x4, ("sw_power_cap",)),
    (0x8, ("hw_slowdown",)),
    (0x20, ("sw_thermal",)),
    (0x40, ("hw_thermal",)),
    (0x80, ("hw_power_brake",)),
    (0x1 | 0x8 | 0x80, ("hw_slowdown", "hw_power_brake")),
    (0x200 | 0x400, ("board_limit", "reliability")),
    (0x1000 | 0x4, ("sw_power_cap", "unknown_0x1000")),
])
def test_throttle_names(bits: int, names: tuple[str, ...]) -> None:
    assert throttle_names(bits) == names
    _, gpus = read_one(FakeGpu(clock_reasons=bits))
    assert gpus[0].throttle == names


def test_throttle_names_match_pynvml_constants() -> None:
    """The hard-coded bits are the ones this nvidia-ml-py names."""
    assert throttle_names(pynvml.nvmlClocksEventReasonHwThermalSlowdown) == ("hw_thermal",)
    assert throttle_names(pynvml.nvmlClocksEventReasonSwPowerCap) == ("sw_power_cap",)
    assert throttle_names(pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown) == (
        "hw_power_brake",)
    board = getattr(pynvml, "nvmlClocksThrottleReasonBoardLimit", None)
    if board is not None:  # newer nvidia-ml-py (a GPU image's, say) no longer names it
        assert throttle_names(board) == ("board_limit",)
    benign = (pynvml.nvmlClocksEventReasonGpuIdle
              | pynvml.nvmlClocksEventReasonApplicationsClocksSetting
              | pynvml.nvmlClocksEventReasonSyncBoost
              | pynvml.nvmlClocksEventReasonDisplayClockSetting)
    assert throttle_names(benign) == ()


def test_throttle_falls_back_to_the_older_call_on_an_older_driver() -> None:
    gpu = FakeGpu(clock_reasons=0x20,
                  fail={"nvmlDeviceGetCurrentClocksEventReasons": FunctionNotFound})
    reader, gpus = read_one(gpu)
    assert gpus[0].throttle == ("sw_thermal",)
    assert not reader.field_errors


def test_mig_profiles() -> None:
    gpu = FakeGpu(uuid="GPU-mig", mig_mode=MIG_ON, mig=[
        FakeMig(uuid="MIG-1", name="NVIDIA A100-SXM4-80GB MIG 1g.10gb",
                memory_total=10 * GiB, memory_free=4 * GiB),
        None,  # an empty slot
        FakeMig(uuid=b"MIG-3", name=b"NVIDIA A100-SXM4-80GB MIG 3g.40gb\x00",
                memory_total=40 * GiB, memory_free=40 * GiB, gi_id=2),
        # a device name without the profile: the GPU instance's profile says it
        FakeMig(uuid="MIG-4", name="MIG device", memory_total=20 * GiB, memory_free=1,
                gi_id=5, profile_id=14, profile_name=b"MIG 2g.20gb"),
        # neither says: the profile is unknown, the instance is still there
        FakeMig(uuid="MIG-5", name="MIG device", gi_id=6, profile_id=99,
                fail={"nvmlDeviceGetGpuInstanceId": NotSupported}),
    ])
    reader, gpus = read_one(gpu)
    assert gpus[0].mig == (
        MigProfile(uuid="MIG-1", profile="1g.10gb", memory_total=10 * GiB,
                   memory_free=4 * GiB),
        MigProfile(uuid="MIG-3", profile="3g.40gb", memory_total=40 * GiB,
                   memory_free=40 * GiB),
        MigProfile(uuid="MIG-4", profile="2g.20gb", memory_total=20 * GiB, memory_free=1),
        MigProfile(uuid="MIG-5", profile="", memory_total=10 * GiB, memory_free=9 * GiB),
    )
    assert not reader.field_errors  # an empty slot is not an error


def test_mig_off_or_unsupported_means_no_profiles() -> None:
    assert read_one(FakeGpu(mig_mode=pynvml.NVML_DEVICE_MIG_DISABLE,
                            mig=[FakeMig(uuid="MIG-x")]))[1][0].mig == ()
    assert read_one(FakeGpu(mig_mode=None))[1][0].mig == ()


def test_not_supported_fields_become_none_and_the_rest_is_there() -> None:
    gpu = FakeGpu(uuid="GPU-geforce", name="NVIDIA GeForce RTX 4090", memory_total=24 * GiB,
                  memory_free=20 * GiB, temperature=60, fail={
                      "nvmlDeviceGetPowerUsage": NotSupported,
                      "nvmlDeviceGetTotalEccErrors": NotSupported,
                      "nvmlDeviceGetUtilizationRates": NotSupported,
                      "nvmlDeviceGetCurrentClocksEventReasons": NotSupported,
                      "nvmlDeviceGetMigMode": NotSupported,
                  })
    reader, gpus = read_one(gpu)
    assert gpus == [GpuState(uuid="GPU-geforce", index=0, name="NVIDIA GeForce RTX 4090",
                             memory_total=24 * GiB, memory_free=20 * GiB, temperature_c=60.0,
                             at=12.5)]
    assert reader.failures == {}
    assert not reader.field_errors  # NotSupported is normal, not an error


def test_other_field_errors_are_counted() -> None:
    gpu = FakeGpu(fail={"nvmlDeviceGetPowerUsage": NoPermission,
                        "nvmlDeviceGetTemperature": Unknown,
                        "nvmlDeviceGetMemoryInfo": NotSupported,
                        "nvmlDeviceGetName": Unknown})
    reader, gpus = read_one(gpu)
    (g,) = gpus
    assert (g.power_w, g.temperature_c, g.name) == (None, None, "")
    assert (g.memory_total, g.memory_free) == (0, 0)  # unknown VRAM: nothing is placed on it
    assert g.sm_util == 50.0 and g.uuid == FakeGpu().uuid
    assert reader.field_errors == {"nvmlDeviceGetPowerUsage:no_permission": 1,
                                   "nvmlDeviceGetTemperature:unknown": 1,
                                   "nvmlDeviceGetName:unknown": 1}


def test_lost_gpu_is_reported_and_the_others_still_read() -> None:
    fake = FakeNvml([
        FakeGpu(uuid="GPU-0"),
        FakeGpu(uuid="GPU-1", lost=True),
        FakeGpu(uuid="GPU-2", fail={"nvmlDeviceGetPowerUsage": GpuIsLost}),  # lost mid-read
        FakeGpu(uuid="GPU-3", fail={"nvmlDeviceGetUUID": Unknown}),  # no identity
        FakeGpu(uuid=""),
        FakeGpu(uuid="GPU-5"),
    ])
    reader = NvmlReader(fake)
    assert reader.open() is None
    gpus = reader.read(1.0)
    assert [g.uuid for g in gpus] == ["GPU-0", "GPU-5"]
    assert [g.index for g in gpus] == [0, 5]
    assert reader.failures == {1: "gpu_is_lost", 2: "gpu_is_lost", 3: "unknown", 4: "unknown"}
    fake.gpus[1].lost = False
    assert [g.uuid for g in reader.read(2.0)] == ["GPU-0", "GPU-1", "GPU-5"]
    assert reader.failures == {2: "gpu_is_lost", 3: "unknown", 4: "unknown"}


def test_bytes_and_str_are_normalised() -> None:
    _, gpus = read_one(FakeGpu(uuid=b"GPU-bytes\x00\x00", name=b"Tesla V100-SXM2-16GB"))
    assert (gpus[0].uuid, gpus[0].name) == ("GPU-bytes", "Tesla V100-SXM2-16GB")
    assert text("GPU-str") == "GPU-str" and text(None) == "" and text(b"\xff") == "\ufffd"


def test_odd_driver_values_are_sanitised() -> None:
    """Utilisation outside 0..100 is not a percentage; free above total is clamped."""
    _, gpus = read_one(FakeGpu(gpu_util=0xFFFFFFFF, mem_util=101, memory_total=GiB,
                               memory_free=2 * GiB))
    (g,) = gpus
    assert (g.sm_util, g.mem_util, g.memory_free, g.memory_total) == (None, None, GiB, GiB)


def test_read_before_open_and_close_twice() -> None:
    fake = FakeNvml([FakeGpu()])
    reader = NvmlReader(fake)
    with pytest.raises(RuntimeError, match="not open"):
        reader.read(0.0)
    assert reader.open() is None
    assert reader.open() is None and fake.refcount == 1  # open is idempotent
    reader.close()
    reader.close()
    assert fake.refcount == 0 and fake.calls["nvmlShutdown"] == 1


def test_error_reason() -> None:
    assert error_reason(GpuIsLost()) == "gpu_is_lost"
    assert error_reason(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)) == "not_supported"
    assert error_reason(pynvml.NVMLError_LibRmVersionMismatch()) == "lib_rm_version_mismatch"
    assert error_reason(pynvml.NVMLError(12345)) == "nvml_error_12345"
    assert error_reason(RuntimeError("x")) == "runtime_error"


# --- property: whatever NVML answers, read() yields valid states ------------------------------

CALLS = [
    "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID", "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetGpuInstanceById", "nvmlGpuInstanceGetInfo",
    "nvmlDeviceGetGpuInstanceProfileInfoById",
]
ERRORS = [pynvml.NVMLError_NotSupported, pynvml.NVMLError_NoPermission, pynvml.NVMLError_Unknown,
          pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_FunctionNotFound,
          pynvml.NVMLError_NotFound, pynvml.NVMLError_Timeout,
          pynvml.NVMLError_InvalidArgument, pynvml.NVMLError_ResetRequired,
          pynvml.NVMLError_CorruptedInforom]
u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
percent = st.one_of(st.integers(0, 100), u32)  # drivers have been seen to send garbage
name = st.one_of(st.text(max_size=40), st.binary(max_size=40))
ident = st.one_of(st.text(min_size=1, max_size=40), st.binary(min_size=1, max_size=40))
failures = st.dictionaries(st.sampled_from(CALLS), st.sampled_from(ERRORS), max_size=4)
migs = st.builds(FakeMig, uuid=ident, name=name, memory_total=u64, memory_free=u64,
                 gi_id=st.integers(0, 8), profile_id=st.integers(0, 20), profile_name=name,
                 fail=failures)
gpus = st.builds(FakeGpu, uuid=ident, name=name, memory_total=u64, memory_free=u64,
                 gpu_util=percent, mem_util=percent, temperature=st.integers(0, 300), power_mw=u32,
                 ecc_uncorrected=u64, ecc_corrected=u64, clock_reasons=u64,
                 mig_mode=st.sampled_from([None, 0, 1, 1]), mig_slots=st.integers(0, 7),
                 mig=st.lists(st.one_of(st.none(), migs), max_size=4),
                 lost=st.sampled_from([False] * 9 + [True]),
                 fail=failures)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(gpus, max_size=4))
def test_read_never_raises_and_yields_valid_states(fleet: list[FakeGpu]) -> None:
    reader = NvmlReader(FakeNvml(fleet))
    assert reader.open() == (None if fleet else "NVML found no GPUs")
    if not fleet:
        return
    states = reader.read(3.0)
    assert len(states) + len(reader.failures) == len(fleet)
    assert {s.index for s in states}.isdisjoint(reader.failures)
    for s in states:
        assert isinstance(s.uuid, str) and s.uuid and isinstance(s.name, str)
        assert 0 <= s.memory_free <= s.memory_total
        for util in (s.sm_util, s.mem_util):
            assert util is None or 0 <= util <= 100
        assert s.power_w is None or s.power_w >= 0
        assert s.ecc_uncorrected is None or s.ecc_uncorrected >= 0
        assert all(isinstance(t, str) and t for t in s.throttle)
        for m in s.mig:
            assert isinstance(m.uuid, str) and m.uuid and isinstance(m.profile, str)
            assert 0 <= m.memory_free <= m.memory_total
        assert s.at == 3.0
        fake = fleet[s.index]
        if "nvmlDeviceGetUtilizationRates" not in fake.fail and fake.gpu_util <= 100:
            assert s.sm_util == fake.gpu_util
        if "nvmlDeviceGetPowerUsage" not in fake.fail:
            assert s.power_w == fake.power_mw / 1000
    assert all(isinstance(r, str) and r for r in reader.failures.values())
    reader.close()


# --- the asyncio shell ------------------------------------------------------------------------


def test_adapter_polls_and_calls_on_update(gpu_log: list[logging.LogRecord]) -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-a", gpu_util=10), FakeGpu(uuid="GPU-b")])
    updates: list[list[GpuState]] = []
    times = iter(float(i) for i in range(1000))
    adapter = GpuAdapter(interval=0.01, reader=NvmlReader(fake), on_update=updates.append,
                         clock=lambda: next(times))

    async def scenario() -> None:
        await adapter.start()
        assert len(updates) == 1  # start returns with the first snapshot in
        fake.gpus[0].gpu_util = 90
        while len(updates) < 4:
            await asyncio.sleep(0.005)
        await adapter.close()

    asyncio.run(scenario())
    assert not adapter.cpu_only and adapter.reason is None
    assert set(adapter.gpus) == {"GPU-a", "GPU-b"}
    assert adapter.gpus["GPU-a"].sm_util == 90.0
    assert [u[0].at for u in updates[:4]] == [0.0, 1.0, 2.0, 3.0]
    assert adapter.polls >= 4 and not adapter.errors and not gpu_log


def test_failed_read_is_counted_logged_once_and_the_loop_goes_on(
        gpu_log: list[logging.LogRecord]) -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-a")])
    adapter = GpuAdapter(interval=0.005, reader=NvmlReader(fake))

    async def scenario() -> None:
        await adapter.start()
        fake.fail["nvmlDeviceGetCount"] = Unknown  # the whole read fails, again and again
        while adapter.errors["read_unknown"] < 3:
            await asyncio.sleep(0.005)
        assert "GPU-a" in adapter.gpus  # the last good snapshot stays
        polls = adapter.polls
        del fake.fail["nvmlDeviceGetCount"]
        while adapter.polls < polls + 2:
            await asyncio.sleep(0.005)
        await adapter.close()

    asyncio.run(scenario())
    failed = events(gpu_log, "gpu_read_failed")
    assert len(failed) == 1 and getattr(failed[0], "reason", None) == "read_unknown"
    assert failed[0].levelno == logging.WARNING


def test_a_reader_bug_is_counted_too(gpu_log: list[logging.LogRecord]) -> None:
    class Broken(NvmlReader):
        def read(self, now: float) -> list[GpuState]:
            raise ZeroDivisionError("oops")

    adapter = GpuAdapter(interval=0.001, reader=Broken(FakeNvml([FakeGpu()])))

    async def scenario() -> None:
        await adapter.start()
        while adapter.errors["read_zero_division_error"] < 5:
            await asyncio.sleep(0.002)
        await adapter.close()

    asyncio.run(scenario())
    assert adapter.polls == 0 and len(events(gpu_log, "gpu_read_failed")) == 1


def test_lost_gpu_in_the_adapter(gpu_log: list[logging.LogRecord]) -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b"), FakeGpu(uuid="GPU-c")])
    adapter = GpuAdapter(interval=0.005, reader=NvmlReader(fake))

    async def scenario() -> None:
        await adapter.start()
        assert set(adapter.gpus) == {"GPU-a", "GPU-b", "GPU-c"}
        fake.gpus[1].lost = True
        while adapter.errors["gpu_is_lost"] < 3:
            await asyncio.sleep(0.005)
        await adapter.close()

    asyncio.run(scenario())
    assert set(adapter.gpus) == {"GPU-a", "GPU-c"}
    assert adapter.failed == {1: "gpu_is_lost"}
    lost = events(gpu_log, "gpu_read_failed")
    assert len(lost) == 1 and getattr(lost[0], "detail", None) == "GPU 1: gpu_is_lost"


def test_on_update_that_raises_does_not_stop_polling(gpu_log: list[logging.LogRecord]) -> None:
    def bad(_: list[GpuState]) -> None:
        raise ValueError("consumer bug")

    adapter = GpuAdapter(interval=0.002, reader=NvmlReader(FakeNvml([FakeGpu()])),
                         on_update=bad)

    async def scenario() -> None:
        await adapter.start()
        while adapter.polls < 4:
            await asyncio.sleep(0.002)
        await adapter.close()

    asyncio.run(scenario())
    assert adapter.errors["on_update_value_error"] >= 4
    assert len(events(gpu_log, "gpu_read_failed")) == 1


def test_nvml_calls_never_block_the_event_loop() -> None:
    """Every fake call sleeps 20 ms (a slow driver): the loop keeps ticking meanwhile."""
    fake = FakeNvml([FakeGpu()], delay=0.02)
    adapter = GpuAdapter(interval=0.0, reader=NvmlReader(fake))
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.002)
            ticks += 1

    async def scenario() -> None:
        task = asyncio.create_task(ticker())
        await adapter.start()  # open + first read: ~15 calls, ~0.3 s, all in a thread
        task.cancel()
        await adapter.close()

    asyncio.run(scenario())
    assert ticks >= 50


def test_close_is_clean() -> None:
    fake = FakeNvml([FakeGpu()], delay=0.01)
    adapter = GpuAdapter(interval=0.0, reader=NvmlReader(fake))

    async def scenario() -> None:
        await adapter.start()
        await asyncio.sleep(0.05)  # a read is in flight in its thread
        await adapter.close()
        calls = sum(fake.calls.values())
        await asyncio.sleep(0.05)
        assert sum(fake.calls.values()) == calls  # nothing polls after close
        await adapter.close()  # twice is fine

    asyncio.run(scenario())
    assert fake.refcount == 0 and fake.calls["nvmlShutdown"] == 1
    assert adapter.errors == {}  # shutdown waited for the read instead of cutting under it
