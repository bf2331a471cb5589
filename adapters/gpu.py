"""The GPU adapter: what NVML says about each local GPU, as :class:`GpuState` values.

Two parts, as elsewhere in meshd:

* :class:`NvmlReader` makes the NVML calls and turns the answers into ``GpuState`` values.  It
  has no asyncio and no clock (``now`` is an argument), so tests drive it with a fake module.
* :class:`GpuAdapter` is the asyncio shell: it runs the reader in a worker thread on a timer.
  NVML calls block (a GPU that fell off the bus can take seconds to answer), so none of them
  runs on the event loop.

What can go wrong is kept as small as it is: a figure a GPU does not report (``NotSupported``
on a consumer card, ECC off, power on some MIG setups) becomes ``None`` for that figure only; a
GPU that cannot be read at all (``GpuIsLost``) is reported by index and reason while the other
GPUs are still read; a node without an NVIDIA driver runs in CPU-only mode, said once in the
log, never a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from types import ModuleType
from typing import Any

from adapters.model import GpuState, MigProfile

log = logging.getLogger("meshd.adapters.gpu")

THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x0000000000000004, "sw_power_cap"),
    (0x0000000000000008, "hw_slowdown"),
    (0x0000000000000020, "sw_thermal"),
    (0x0000000000000040, "hw_thermal"),
    (0x0000000000000080, "hw_power_brake"),
    (0x0000000000000200, "board_limit"),
    (0x0000000000000400, "reliability"),
)
"""Clock-event bits that mean the GPU runs slower than it could, and their names.

The values are NVML's ABI (``nvmlClocksEventReason*`` and the deprecated
``nvmlClocksThrottleReason*`` share them).  Left out on purpose, because they are not a
problem to act on: ``GpuIdle`` (0x1), ``ApplicationsClocksSetting`` (0x2), ``SyncBoost`` (0x10,
clocks matched to a sync-boost group) and ``DisplayClockSetting`` (0x100).  A bit NVML adds
later shows up as ``unknown_0x...`` rather than being silently dropped.
"""

_BENIGN_THROTTLE = 0x1 | 0x2 | 0x10 | 0x100
_KNOWN_THROTTLE = _BENIGN_THROTTLE | sum(bit for bit, _ in THROTTLE_REASONS)

FATAL_REASONS = frozenset({"gpu_is_lost", "reset_required", "uninitialized"})
"""NVML errors after which nothing else about a GPU is worth asking: the GPU is counted as
unreadable instead of being reported with every figure missing."""

_MIG_NAME = re.compile(r"\bMIG\s+((?:\d+c\.)?\d+g\.\d+gb\S*)\s*$")
"""``NVIDIA A100-SXM4-80GB MIG 1g.10gb`` (also ``1c.2g.20gb``, ``1g.10gb+me``)."""


def error_reason(exc: BaseException) -> str:
    """A short, stable label for an error, fit for a log field or a metric label.

    ``NVMLError_GpuIsLost`` -> ``gpu_is_lost``; any other exception -> its class name in
    snake case (``RuntimeError`` -> ``runtime_error``).
    """
    name = type(exc).__name__
    if name.startswith("NVMLError_"):
        name = name[len("NVMLError_"):]
    elif name == "NVMLError":
        return f"nvml_error_{getattr(exc, 'value', 'unknown')}"
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def text(value: object) -> str:
    """NVML strings are ``bytes`` from older nvidia-ml-py releases and ``str`` from newer
    ones; either way the agent wants ``str`` without NULs or padding."""
    if value is None:
        return ""
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8", "replace")
    return str(value).strip("\x00 \t\r\n")


def throttle_names(bits: int) -> tuple[str, ...]:
    """Readable names of the active clock-event bits that are worth acting on."""
    names = [name for bit, name in THROTTLE_REASONS if bits & bit]
    unknown = bits & ~_KNOWN_THROTTLE
    names += [f"unknown_{1 << i:#x}" for i in range(unknown.bit_length()) if unknown >> i & 1]
    return tuple(names)


def _percent(value: Any) -> float | None:
    """NVML utilisation in percent; anything outside 0..100 is a driver oddity, not a figure."""
    return float(value) if isinstance(value, int | float) and 0 <= value <= 100 else None


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and value >= 0 else None


class NvmlReader:
    """Reads every local GPU through NVML; blocking, so run it off the event loop.

    ``nvml`` is the ``pynvml`` module (from ``nvidia-ml-py``), imported on :meth:`open` when
    not given; tests pass a fake with the same functions.  Calls are serialised by a lock so
    that :meth:`close` never shuts NVML down under a read still running in another thread.
    """

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self.nvml = nvml
        self.failures: dict[int, str] = {}
        """GPUs (by NVML index) the last :meth:`read` could not read, and why."""
        self.field_errors: Counter[str] = Counter()
        """Figures left out for a reason other than ``not_supported``, by ``call:reason``
        (e.g. ``nvmlDeviceGetPowerUsage:no_permission``), over the reader's life."""
        self._open = False
        self._lock = threading.Lock()

    def open(self) -> str | None:
        """Initialise NVML.  ``None`` when there are GPUs to read; otherwise why not (the
        agent then runs CPU-only), e.g. ``NVML unavailable: NVML Shared Library Not Found``."""
        with self._lock:
            if self._open:
                return None
            try:
                nvml = self.nvml if self.nvml is not None else importlib.import_module("pynvml")
            except ImportError as exc:
                return f"NVML unavailable: cannot import pynvml ({exc})"
            self.nvml = nvml
            try:
                nvml.nvmlInit()
            except Exception as exc:  # noqa: BLE001 - NVMLError, OSError from ctypes, ...
                detail = str(exc) if isinstance(exc, (nvml.NVMLError, OSError)) else repr(exc)
                return f"NVML unavailable: {detail}"
            self._open = True
            try:
                count = nvml.nvmlDeviceGetCount()
            except nvml.NVMLError as exc:
                self._shutdown()
                return f"NVML unavailable: cannot count GPUs: {exc}"
            if count == 0:
                self._shutdown()
                return "NVML found no GPUs"
            return None

    def close(self) -> None:
        """Shut NVML down; waits for a read in progress.  Safe to call twice."""
        with self._lock:
            self._shutdown()

    def _shutdown(self) -> None:
        if self._open and self.nvml is not None:
            self._open = False
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlShutdown()

    def read(self, now: float) -> list[GpuState]:
        """One ``GpuState`` per GPU that answered, measured at ``now``.

        Raises only when NVML cannot even count the GPUs (or is not open); a GPU that cannot
        be read lands in :attr:`failures` and the others are still returned.
        """
        with self._lock:
            nvml = self.nvml
            if not self._open or nvml is None:
                raise RuntimeError("NVML is not open")
            out: list[GpuState] = []
            failures: dict[int, str] = {}
            for index in range(nvml.nvmlDeviceGetCount()):
                try:
                    out.append(self._gpu(nvml, index, now))
                except nvml.NVMLError as exc:
                    failures[index] = error_reason(exc)
            self.failures = failures
            return out

    # --- one GPU --------------------------------------------------------------------------

    def _field(self, nvml: ModuleType, call: str, *args: Any) -> Any:
        """One figure: the call's answer, or ``None`` when NVML will not give it.

        A fatal error (the GPU is lost) propagates, so the GPU is reported as unreadable
        rather than as a GPU with every figure missing.
        """
        fn = getattr(nvml, call, None)
        if fn is None:  # an older nvidia-ml-py without this call
            return None
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            reason = error_reason(exc)
            if reason in FATAL_REASONS:
                raise
            if reason != "not_supported":
                self.field_errors[f"{call}:{reason}"] += 1
            return None

    def _gpu(self, nvml: ModuleType, index: int, now: float) -> GpuState:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = text(nvml.nvmlDeviceGetUUID(handle))  # no uuid, no identity: the GPU fails
        if not uuid:
            raise nvml.NVMLError(nvml.NVML_ERROR_UNKNOWN)
        total, free = self._memory(nvml, handle)
        util = self._field(nvml, "nvmlDeviceGetUtilizationRates", handle)
        temp = self._field(nvml, "nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU)
        power_mw = self._field(nvml, "nvmlDeviceGetPowerUsage", handle)
        return GpuState(
            uuid=uuid,
            index=index,
            name=text(self._field(nvml, "nvmlDeviceGetName", handle)),
            memory_total=total,
            memory_free=free,
            sm_util=_percent(getattr(util, "gpu", None)),
            mem_util=_percent(getattr(util, "memory", None)),
            temperature_c=float(temp) if isinstance(temp, int | float) else None,
            power_w=power_mw / 1000.0 if isinstance(power_mw, int | float) else None,
            ecc_uncorrected=self._ecc(nvml, handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            ecc_corrected=self._ecc(nvml, handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            throttle=self._throttle(nvml, handle),
            mig=self._mig(nvml, handle),
            at=now,
        )

    def _memory(self, nvml: ModuleType, handle: Any) -> tuple[int, int]:
        """(total, free) bytes.  ``GpuState`` has no "unknown" for memory, so a device that
        will not say reads as 0 of 0: nothing gets placed on VRAM nobody can vouch for."""
        mem = self._field(nvml, "nvmlDeviceGetMemoryInfo", handle)
        total = _count(getattr(mem, "total", None)) or 0
        free = _count(getattr(mem, "free", None)) or 0
        return total, min(free, total)

    def _ecc(self, nvml: ModuleType, handle: Any, kind: int) -> int | None:
        return _count(self._field(nvml, "nvmlDeviceGetTotalEccErrors", handle, kind,
                                  nvml.NVML_VOLATILE_ECC))

    def _throttle(self, nvml: ModuleType, handle: Any) -> tuple[str, ...]:
        """Active clock-event reasons.  nvidia-ml-py 12.535+ names the call
        ``...ClocksEventReasons``; older drivers lack that symbol (``FunctionNotFound``), and
        older bindings lack the function, so fall back to ``...ClocksThrottleReasons``."""
        bits: Any = None
        for call in ("nvmlDeviceGetCurrentClocksEventReasons",
                     "nvmlDeviceGetCurrentClocksThrottleReasons"):
            if not hasattr(nvml, call):
                continue
            try:
                bits = getattr(nvml, call)(handle)
                break
            except nvml.NVMLError as exc:
                reason = error_reason(exc)
                if reason in FATAL_REASONS:
                    raise
                if reason != "function_not_found":
                    if reason != "not_supported":
                        self.field_errors[f"{call}:{reason}"] += 1
                    break
        return throttle_names(bits) if isinstance(bits, int) and bits >= 0 else ()

    def _mig(self, nvml: ModuleType, handle: Any) -> tuple[MigProfile, ...]:
        """The MIG instances of a GPU in MIG mode; ``()`` when MIG is off or not supported.

        Slots without an instance answer ``NotFound`` and are skipped; an instance that
        cannot name its UUID is left out (it cannot be addressed anyway).
        """
        mode = self._field(nvml, "nvmlDeviceGetMigMode", handle)
        if not mode or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
            return ()
        slots = self._field(nvml, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0
        out: list[MigProfile] = []
        for slot in range(slots):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                uuid = text(nvml.nvmlDeviceGetUUID(mig))
            except nvml.NVMLError as exc:
                reason = error_reason(exc)
                if reason in FATAL_REASONS:
                    raise
                if reason != "not_found":  # not_found: an empty slot
                    self.field_errors[f"mig:{reason}"] += 1
                continue
            if not uuid:
                continue
            total, free = self._memory(nvml, mig)
            out.append(MigProfile(uuid=uuid, profile=self._profile(nvml, handle, mig),
                                  memory_total=total, memory_free=free))
        return tuple(out)

    def _profile(self, nvml: ModuleType, parent: Any, mig: Any) -> str:
        """The MIG profile (``1g.10gb``): NVML names a MIG device ``<GPU name> MIG 1g.10gb``;
        when it does not, ask the GPU instance's profile; ``""`` when neither says."""
        match = _MIG_NAME.search(text(self._field(nvml, "nvmlDeviceGetName", mig)))
        if match:
            return match.group(1)
        gi_id = self._field(nvml, "nvmlDeviceGetGpuInstanceId", mig)
        gi = None if gi_id is None else self._field(nvml, "nvmlDeviceGetGpuInstanceById",
                                                     parent, gi_id)
        info = None if gi is None else self._field(nvml, "nvmlGpuInstanceGetInfo", gi)
        profile_id = getattr(info, "profileId", None)
        prof = None if profile_id is None else self._field(
            nvml, "nvmlDeviceGetGpuInstanceProfileInfoById", parent, profile_id)
        name = text(getattr(prof, "name", ""))
        return name.removeprefix("MIG").strip()


class GpuAdapter:
    """Keeps :attr:`gpus` (by uuid) fresh by reading NVML every ``interval`` seconds.

    Without a driver it sets :attr:`cpu_only` and :attr:`reason`, logs one line and does
    nothing else.  A read that fails is counted in :attr:`errors` by reason (and logged once
    per reason); the last good snapshot stays, its ``at`` showing its age.
    """

    def __init__(self, interval: float = 1.0, reader: NvmlReader | None = None,
                 on_update: Callable[[list[GpuState]], None] | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.reader = reader if reader is not None else NvmlReader()
        self.on_update = on_update
        self.clock = clock
        self.cpu_only = False
        self.reason: str | None = None
        """Why the node runs CPU-only; ``None`` while NVML works (or before :meth:`start`)."""
        self.gpus: dict[str, GpuState] = {}
        self.failed: dict[int, str] = {}
        """GPUs (by NVML index) the last poll could not read, and why."""
        self.errors: Counter[str] = Counter()
        """Failures by reason: ``gpu_is_lost`` etc. once per unreadable GPU per poll,
        ``read_<reason>`` for a poll that failed as a whole, ``on_update_<reason>``."""
        self.polls = 0
        """Polls that produced a snapshot."""
        self._task: asyncio.Task[None] | None = None
        self._started = False
        self._logged: set[str] = set()

    async def start(self) -> None:
        """Open NVML (in a thread), take the first snapshot, then keep polling."""
        reason = await asyncio.to_thread(self.reader.open)
        if reason is not None:
            self.cpu_only, self.reason = True, reason
            log.info("no GPU telemetry, running CPU-only: %s", reason,
                     extra={"event": "gpu_cpu_only", "detail": reason})
            return
        self._started = True
        await self.poll()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="gpu-adapter")

    async def close(self) -> None:
        """Stop polling and shut NVML down (after any read still running in its thread)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._started:
            self._started = False
            await asyncio.to_thread(self.reader.close)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.poll()

    async def poll(self) -> None:
        """One read: update :attr:`gpus` and :attr:`failed`, count failures, notify."""
        try:
            gpus = await asyncio.to_thread(self.reader.read, self.clock())
        except Exception as exc:  # noqa: BLE001 - one bad read must not end the polling
            self._failure(f"read_{error_reason(exc)}", "GPU read failed", str(exc) or repr(exc))
            return
        self.polls += 1
        self.gpus = {g.uuid: g for g in gpus}
        self.failed = dict(self.reader.failures)
        for index, reason in sorted(self.failed.items()):
            self._failure(reason, "GPU could not be read", f"GPU {index}: {reason}")
        if self.on_update is not None:
            try:
                self.on_update(gpus)
            except Exception as exc:  # noqa: BLE001 - a consumer's bug is not a GPU failure
                self._failure(f"on_update_{error_reason(exc)}", "GPU update handler failed",
                              repr(exc))

    def _failure(self, reason: str, message: str, detail: str) -> None:
        self.errors[reason] += 1
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning(message, extra={"event": "gpu_read_failed", "reason": reason,
                                        "detail": detail})
