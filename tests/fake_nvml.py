"""A fake ``pynvml`` for tests: configurable GPUs behind the calls ``adapters.gpu`` makes.

Constants and exception classes are the real ones from ``pynvml`` (nvidia-ml-py), so the
adapter's ``except nvml.NVMLError`` clauses and reason labels are exercised as they would be
against a driver.  Only the device answers are made up.  Test-only: the product never imports it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

import pynvml

Failure = type[pynvml.NVMLError] | pynvml.NVMLError
"""An NVML error class (``pynvml.NVMLError_NotSupported``) or instance to raise."""

NotSupported = pynvml.NVMLError_NotSupported
GpuIsLost = pynvml.NVMLError_GpuIsLost
LibraryNotFound = pynvml.NVMLError_LibraryNotFound
FunctionNotFound = pynvml.NVMLError_FunctionNotFound
NotFound = pynvml.NVMLError_NotFound
NoPermission = pynvml.NVMLError_NoPermission
Unknown = pynvml.NVMLError_Unknown
InvalidArgument = pynvml.NVMLError_InvalidArgument
Uninitialized = pynvml.NVMLError_Uninitialized

GiB = 1 << 30


@dataclass
class FakeMig:
    """One MIG device.  ``name`` is what ``nvmlDeviceGetName`` answers for it (NVML's
    ``<GPU> MIG 1g.10gb``); ``profile_name`` is the GPU-instance profile's name."""

    uuid: str | bytes
    name: str | bytes = "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    memory_total: int = 10 * GiB
    memory_free: int = 9 * GiB
    gi_id: int = 1
    profile_id: int = 19
    profile_name: str | bytes = "MIG 1g.10gb"
    fail: dict[str, Failure] = field(default_factory=dict)


@dataclass
class FakeGpu:
    """One physical GPU.  ``fail`` maps a call name (``nvmlDeviceGetPowerUsage``) to the
    error it raises for this GPU; ``lost`` makes every call raise ``GpuIsLost``.
    ``mig_mode`` ``None`` means the GPU has no MIG (``NotSupported``); ``mig`` entries that
    are ``None`` are empty slots (``NotFound``)."""

    uuid: str | bytes = "GPU-00000000-0000-0000-0000-000000000000"
    name: str | bytes = "NVIDIA A100-SXM4-80GB"
    memory_total: int = 80 * GiB
    memory_free: int = 60 * GiB
    gpu_util: int = 50
    mem_util: int = 20
    temperature: int = 55
    power_mw: int = 250_000
    ecc_uncorrected: int = 0
    ecc_corrected: int = 0
    clock_reasons: int = 0
    mig_mode: int | None = None
    mig_slots: int = 7
    mig: list[FakeMig | None] = field(default_factory=list)
    lost: bool = False
    fail: dict[str, Failure] = field(default_factory=dict)


@dataclass(frozen=True)
class _Handle:
    gpu: FakeGpu
    mig: FakeMig | None = None


@dataclass(frozen=True)
class _GpuInstance:
    gpu: FakeGpu
    mig: FakeMig


def _raise(failure: Failure) -> None:
    raise failure() if isinstance(failure, type) else failure


class FakeNvml(ModuleType):
    """A module object with pynvml's names; pass it as ``NvmlReader(nvml=FakeNvml(...))``.

    ``init_error`` is raised by ``nvmlInit`` (e.g. ``LibraryNotFound``); ``fail`` maps call
    names to errors for every GPU (and for the calls without a device, like
    ``nvmlDeviceGetCount``); ``delay`` seconds of blocking sleep in every call shows whether
    the caller keeps NVML off the event loop.  ``calls`` counts calls by name.
    """

    def __init__(self, gpus: list[FakeGpu] | None = None, *,
                 init_error: Failure | None = None, delay: float = 0.0) -> None:
        super().__init__("pynvml")
        for name, value in vars(pynvml).items():
            if name.startswith(("NVML_", "NVMLError", "nvmlClocks", "NVMLLibrary")):
                setattr(self, name, value)
        self.gpus: list[FakeGpu] = list(gpus or [])
        self.init_error = init_error
        self.fail: dict[str, Failure] = {}
        self.delay = delay
        self.refcount = 0
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    # --- plumbing -------------------------------------------------------------------------

    def _enter(self, call: str, handle: _Handle | None = None) -> None:
        with self._lock:
            self.calls[call] += 1
        if self.delay:
            time.sleep(self.delay)
        if not self.refcount:
            raise Uninitialized()
        if call in self.fail:
            _raise(self.fail[call])
        if handle is not None:
            if handle.gpu.lost:
                raise GpuIsLost()
            where = handle.mig.fail if handle.mig is not None else handle.gpu.fail
            if call in where:
                _raise(where[call])

    def _device(self, h: _Handle) -> FakeGpu | FakeMig:
        return h.mig if h.mig is not None else h.gpu

    # --- lifecycle --------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        with self._lock:
            self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            _raise(self.init_error)
        self.refcount += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.refcount -= 1

    # --- devices ----------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise InvalidArgument()
        h = _Handle(self.gpus[index])
        self._enter("nvmlDeviceGetHandleByIndex", h)  # a lost GPU fails here already
        return h

    def nvmlDeviceGetUUID(self, h: _Handle) -> str | bytes:
        self._enter("nvmlDeviceGetUUID", h)
        return self._device(h).uuid

    def nvmlDeviceGetName(self, h: _Handle) -> str | bytes:
        self._enter("nvmlDeviceGetName", h)
        return self._device(h).name

    def nvmlDeviceGetMemoryInfo(self, h: _Handle, version: Any = None) -> SimpleNamespace:
        self._enter("nvmlDeviceGetMemoryInfo", h)
        d = self._device(h)
        return SimpleNamespace(total=d.memory_total, free=d.memory_free,
                               used=max(0, d.memory_total - d.memory_free))

    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> SimpleNamespace:
        self._enter("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=h.gpu.gpu_util, memory=h.gpu.mem_util)

    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", h)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise InvalidArgument()
        return h.gpu.temperature

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetPowerUsage", h)
        return h.gpu.power_mw

    def nvmlDeviceGetTotalEccErrors(self, h: _Handle, error_type: int, counter: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", h)
        if counter != pynvml.NVML_VOLATILE_ECC:
            raise InvalidArgument()
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return h.gpu.ecc_uncorrected
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return h.gpu.ecc_corrected
        raise InvalidArgument()

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", h)
        return h.gpu.clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return h.gpu.clock_reasons

    # --- MIG --------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, h: _Handle) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", h)
        if h.gpu.mig_mode is None or h.mig is not None:
            raise NotSupported()
        return [h.gpu.mig_mode, h.gpu.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", h)
        if h.gpu.mig_mode is None:
            raise NotSupported()
        return h.gpu.mig_slots

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: _Handle, index: int) -> _Handle:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if h.gpu.mig_mode != pynvml.NVML_DEVICE_MIG_ENABLE:
            raise InvalidArgument()
        if not 0 <= index < h.gpu.mig_slots:
            raise InvalidArgument()
        mig = h.gpu.mig[index] if index < len(h.gpu.mig) else None
        if mig is None:
            raise NotFound()
        return _Handle(h.gpu, mig)

    def nvmlDeviceGetGpuInstanceId(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId", h)
        if h.mig is None:
            raise InvalidArgument()
        return h.mig.gi_id

    def nvmlDeviceGetGpuInstanceById(self, h: _Handle, gi_id: int) -> _GpuInstance:
        self._enter("nvmlDeviceGetGpuInstanceById", h)
        for mig in h.gpu.mig:
            if mig is not None and mig.gi_id == gi_id:
                return _GpuInstance(h.gpu, mig)
        raise NotFound()

    def nvmlGpuInstanceGetInfo(self, gi: _GpuInstance) -> SimpleNamespace:
        self._enter("nvmlGpuInstanceGetInfo", _Handle(gi.gpu))
        return SimpleNamespace(id=gi.mig.gi_id, profileId=gi.mig.profile_id)

    def nvmlDeviceGetGpuInstanceProfileInfoById(self, h: _Handle,
                                                profile_id: int) -> SimpleNamespace:
        self._enter("nvmlDeviceGetGpuInstanceProfileInfoById", h)
        for mig in h.gpu.mig:
            if mig is not None and mig.profile_id == profile_id:
                return SimpleNamespace(id=profile_id, name=mig.profile_name,
                                       memorySizeMB=mig.memory_total >> 20)
        raise InvalidArgument()
