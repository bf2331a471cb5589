"""Real Triton servers on loopback, for tests, benchmarks and the local dev mesh.

The PyPI wheel ``nvidia-pytriton`` bundles a CPU build of Triton Inference Server (2.51) and its
Python backend. This module runs that ``tritonserver`` directly - not through PyTriton's own
Python API - on a standard model repository (``tests/triton_models`` by default), so meshd's
adapters, routers and benchmarks talk to the real thing: KServe v2 gRPC/HTTP, the model
repository API, and ``/metrics`` (``nv_inference_pending_request_count`` and friends)::

    with TritonServer(repo, work_dir) as server:        # free ports on 127.0.0.1
        client = tritonclient.grpc.InferenceServerClient(server.grpc_url)
        server.set_behaviour("delay", delay_ms=50)      # this replica is now slow
        server.set_behaviour("delay", stall=True)       # ... now it hangs
        server.clear_behaviour()                        # ... healthy again
        server.kill(); server.restart()                 # dies; comes back on the same ports

What it takes to run the wheel's server outside PyTriton (see :class:`TritonInstall`):

- ``LD_LIBRARY_PATH`` gets ``site-packages/nvidia_pytriton.libs`` (libtritonserver and its
  vendored dependencies) and the directory of this interpreter's ``libpython3.X.so``;
- a backend directory is assembled per server from symlinks: ``libtriton_python.so``,
  ``triton_python_backend_utils.py`` and the stub for *this* Python version
  (``python_backend_stubs/3.X/triton_python_backend_stub``);
- ``PATH`` starts with this interpreter's ``bin`` directory: the stub embeds Python and finds
  its prefix by looking for ``python3`` on ``PATH``, so it runs in this virtualenv (numpy).

Behaviour control: each server has a JSON control file (``<work_dir>/control.json``) whose path
reaches the models through the environment variable ``MESHD_DEVTRITON_CONTROL`` (inherited by
the Python-backend stub processes). Models that honour it (``delay`` in ``tests/triton_models``)
re-read it at most every 50 ms, so a test can make one replica slow, jittery, stalled or failing
while it runs, and undo it. :func:`write_behaviour` is the format's single writer.

Lifecycle: each ``tritonserver`` runs in its own process group with its output in
``<work_dir>/tritonserver.log``. :meth:`TritonServer.stop` sends SIGTERM (Triton drains and
unloads its models, which ends the stubs), then SIGKILL to the whole group after ``timeout``,
and always sweeps the group so no stub outlives its server. On Linux the kernel also kills the
server if the process that started it (from its main thread) dies, and an ``atexit`` hook stops
whatever is still running.

CLI (``meshd-devtriton``): start N servers for the local mesh and keep them until Ctrl-C, or
change a running server's behaviour; see :func:`main`.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from meshd.dev.ports import pick_ports
from meshd.dev.processes import group_members, pdeathsig_prefix

CONTROL_ENV = "MESHD_DEVTRITON_CONTROL"
"""Environment variable that carries a server's control file path to its models."""

CONTROL_REFRESH_S = 0.05
"""Models re-read the control file at most this often (seconds); see ``tests/triton_models``."""

DEFAULT_REPO = Path(__file__).resolve().parents[2] / "tests" / "triton_models"
"""The model repository shipped in a meshd checkout (``add_sub``, ``delay``)."""

PORTS_PER_SERVER = 3
"""The CLI gives server ``i`` ports ``base+3i`` (gRPC), ``base+3i+1`` (HTTP), ``+2`` (metrics)."""

_WHEEL = "nvidia-pytriton"
_BIND_ERRORS = ("already in use", "failed to bind", "couldn't bind", "failed to listen")


class TritonUnavailable(RuntimeError):
    """Triton cannot run here; the message says why (see :func:`unavailable_reason`)."""


class TritonStartError(RuntimeError):
    """``tritonserver`` died or did not become ready; the message ends with its log tail."""

    def __init__(self, server: str, message: str) -> None:
        super().__init__(message)
        self.server = server
        """The name of the server that failed."""


# --------------------------------------------------------------------------- the installation


@dataclass(frozen=True)
class TritonInstall:
    """Where the pieces of the wheel's Triton are, and the environment they need."""

    binary: Path
    """``pytriton/tritonserver/bin/tritonserver``."""
    lib_dir: Path
    """``site-packages/nvidia_pytriton.libs``: libtritonserver and its vendored libraries."""
    python_backend_dir: Path
    """Holds ``libtriton_python.so`` and ``triton_python_backend_utils.py``."""
    stub: Path
    """The Python-backend stub built for this interpreter's Python version."""
    python_bin_dir: Path
    """This interpreter's ``bin``; first on ``PATH`` so the stub's embedded Python uses it."""
    python_lib_dir: Path | None
    """Directory of this interpreter's ``libpython3.X.so`` (None: the system loader finds one)."""
    version: str
    """The nvidia-pytriton wheel version (0.7.0 ships Triton 2.51)."""

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default ``os.environ``) plus the library path and ``PATH`` the server needs."""
        env = dict(os.environ if base is None else base)
        libs = [str(self.lib_dir)]
        if self.python_lib_dir is not None:
            libs.append(str(self.python_lib_dir))
        if env.get("LD_LIBRARY_PATH"):
            libs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
        env["PATH"] = os.pathsep.join(p for p in (str(self.python_bin_dir), env.get("PATH")) if p)
        return env


def _check_install(
    python_version: tuple[int, int] | None = None,
) -> tuple[TritonInstall | None, str | None]:
    """Look for a usable Triton for ``python_version`` (default: this interpreter's).

    Returns ``(install, None)`` or ``(None, reason)``. Never imports pytriton (slow, and not
    needed): the files are located through the wheel's metadata.
    """
    major, minor = python_version or sys.version_info[:2]
    machine = platform.machine().lower()
    if not sys.platform.startswith("linux") or machine not in ("x86_64", "amd64", "aarch64"):
        return None, (f"Triton from the {_WHEEL} wheel needs Linux x86_64 "
                      f"(this is {sys.platform} {platform.machine()})")
    try:
        dist = importlib.metadata.distribution(_WHEEL)
    except importlib.metadata.PackageNotFoundError:
        return None, (f"the {_WHEEL} wheel is not installed "
                      f"(pip install -e '.[triton]', or ./dev which does it)")
    root = Path(str(dist.locate_file("pytriton/tritonserver")))
    binary = root / "bin" / "tritonserver"
    if not binary.is_file() or not os.access(binary, os.X_OK):
        return None, f"{_WHEEL} {dist.version} has no executable tritonserver at {binary}"
    lib_dir = Path(str(dist.locate_file("nvidia_pytriton.libs")))
    if not lib_dir.is_dir():
        return None, f"{_WHEEL} {dist.version}: the library directory {lib_dir} is missing"
    backend = root / "backends" / "python"
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        if not (backend / name).is_file():
            return None, f"{_WHEEL} {dist.version}: the Python backend lacks {backend / name}"
    stubs = root / "python_backend_stubs"
    stub = stubs / f"{major}.{minor}" / "triton_python_backend_stub"
    if not stub.is_file():
        have = sorted(p.name for p in stubs.iterdir()) if stubs.is_dir() else []
        return None, (f"{_WHEEL} {dist.version} has no Python backend stub for Python "
                      f"{major}.{minor} (it has: {', '.join(have) or 'none'})")
    if importlib.util.find_spec("numpy") is None:
        return None, "numpy is not installed (the Python backend's models need it)"
    python_lib_dir: Path | None = None
    if python_version is None or tuple(python_version) == sys.version_info[:2]:
        libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
        if libdir and soname and (Path(libdir) / soname).is_file() and soname.endswith(".so.1.0"):
            python_lib_dir = Path(libdir)
        else:
            import ctypes.util

            if ctypes.util.find_library(f"python{major}.{minor}") is None:
                return None, (f"the Python backend stub needs libpython{major}.{minor}.so "
                              f"(a shared-library build of Python); this interpreter has none")
    install = TritonInstall(
        binary=binary, lib_dir=lib_dir, python_backend_dir=backend, stub=stub,
        python_bin_dir=Path(sys.executable).parent, python_lib_dir=python_lib_dir,
        version=dist.version)
    return install, None


@functools.cache
def _probe() -> tuple[TritonInstall | None, str | None]:
    return _check_install()


def find_tritonserver() -> TritonInstall | None:
    """The wheel's Triton if it can run here, else None (then :func:`unavailable_reason` says why).

    Cached: the answer does not change within a process."""
    return _probe()[0]


def unavailable_reason() -> str | None:
    """Why Triton cannot run here (for ``pytest.skip``), or None when it can."""
    return _probe()[1]


# --------------------------------------------------------------------------- behaviour control


def write_behaviour(control_path: Path, models: dict[str, dict[str, Any]],
                    stopping: bool = False) -> None:
    """Write a server's control file: ``{"models": {name: {delay_ms, jitter_ms, spike_ms,
    spike_rate, fail, stall}},
    "stopping": bool}``.

    ``stopping`` tells the models the server is about to get SIGTERM: stalled requests end with
    an error and long delays are cut short, or Triton could not drain (it does not count a
    request stuck in a Python model as in flight, then waits on that model's unload until it is
    killed). Atomic (temp file + rename), so a model never reads half a file."""
    control_path = Path(control_path)
    control_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".control-", dir=control_path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"models": models, "stopping": stopping}, f, sort_keys=True)
        os.replace(tmp, control_path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_behaviour(control_path: Path) -> dict[str, dict[str, Any]]:
    """The ``models`` section of a control file ({} if there is none)."""
    try:
        doc = json.loads(Path(control_path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    models = doc.get("models", {}) if isinstance(doc, dict) else {}
    return models if isinstance(models, dict) else {}


def behaviour_entry(delay_ms: float = 0, jitter_ms: float = 0, fail: bool = False,
                    stall: bool = False, spike_ms: float = 0, spike_rate: float = 0,
                    pauses: Sequence[tuple[float, float]] = ()) -> dict[str, Any]:
    """One model's behaviour as stored in the control file ({} = normal); checks the values.
    ``pauses`` are ``(start, end)`` windows on ``time.monotonic()`` during which the replica
    is frozen (see ``tests/triton_models/delay``)."""
    if delay_ms < 0 or jitter_ms < 0 or spike_ms < 0:
        raise ValueError(f"delay_ms, jitter_ms and spike_ms must be >= 0 "
                         f"(got {delay_ms}, {jitter_ms}, {spike_ms})")
    if not 0 <= spike_rate <= 1:
        raise ValueError(f"spike_rate must be in [0, 1] (got {spike_rate})")
    windows = [[float(a), float(b)] for a, b in pauses]
    if any(not a < b for a, b in windows):
        raise ValueError(f"each pause must end after it starts (got {windows})")
    entry: dict[str, Any] = {}
    if delay_ms:
        entry["delay_ms"] = float(delay_ms)
    if jitter_ms:
        entry["jitter_ms"] = float(jitter_ms)
    if spike_ms and spike_rate:
        entry["spike_ms"] = float(spike_ms)
        entry["spike_rate"] = float(spike_rate)
    if windows:
        entry["pauses"] = windows
    if fail:
        entry["fail"] = True
    if stall:
        entry["stall"] = True
    return entry


# --------------------------------------------------------------------------- processes

_LIVE: weakref.WeakSet[TritonServer] = weakref.WeakSet()


def _stop_all_at_exit() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop(timeout=5)


atexit.register(_stop_all_at_exit)


# --------------------------------------------------------------------------- the server


class TritonServer:
    """One real ``tritonserver`` on ``host`` with its own ports, log, backend dir and control file.

    Ports left at 0 are chosen when the object is made (free, random, below the ephemeral
    range), so URLs are known before :meth:`start` and :meth:`restart` reuses them. ``models``
    restricts which models of ``repo`` are served (through a repository of symlinks in
    ``work_dir``); with ``explicit=True`` the server runs ``--model-control-mode=explicit`` and
    loads ``models`` (none if None) at start, so tests can load and unload through the model
    repository API. ``name`` becomes Triton's ``--id`` (server metadata) and labels errors.
    """

    EXIT_TIMEOUT_S = 3
    """``--exit-timeout-secs``: how long Triton waits for in-flight requests after SIGTERM.
    Short: a request stuck in a model that ignores the control file's ``stopping`` flag cannot
    hold a stop for long (after this Triton gives up on it, and :meth:`stop` kills)."""

    def __init__(self, repo: Path, work_dir: Path, host: str = "127.0.0.1", grpc_port: int = 0,
                 http_port: int = 0, metrics_port: int = 0, models: list[str] | None = None,
                 explicit: bool = False, name: str = "") -> None:
        self.repo = Path(repo).resolve()
        self.work_dir = Path(work_dir).resolve()
        self.host = host
        self.models = list(models) if models is not None else None
        self.explicit = explicit
        self.name = name or self.work_dir.name
        self._fixed = (grpc_port, http_port, metrics_port)
        self.grpc_port, self.http_port, self.metrics_port = self._choose_ports()
        self.control_path = self.work_dir / "control.json"
        self.log_path = self.work_dir / "tritonserver.log"
        self.start_seconds: float | None = None
        """How long the last successful :meth:`start` took (launch to ready)."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._launched_at = 0.0
        self._terminated = False  # SIGTERM sent to the current process
        self._shm_prefix = ""
        self._log_offset = 0
        self._behaviours: dict[str, dict[str, Any]] = {}
        self._lock = threading.RLock()
        self._starts = 0
        if not self.repo.is_dir():
            raise ValueError(f"model repository {self.repo} is not a directory")
        for model in self.models or []:
            if not (self.repo / model / "config.pbtxt").is_file():
                raise ValueError(f"model {model!r} is not in {self.repo} (no config.pbtxt)")

    def _choose_ports(self) -> tuple[int, int, int]:
        auto = iter(pick_ports(self.host, sum(1 for p in self._fixed if not p)))
        grpc, http, metrics = (p or next(auto) for p in self._fixed)
        return grpc, http, metrics

    # -- addresses

    @property
    def grpc_url(self) -> str:
        """``HOST:PORT`` for ``tritonclient.grpc`` (and meshd's adapter)."""
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        """``http://HOST:PORT`` (KServe v2 HTTP)."""
        return f"http://{self.host}:{self.http_port}"

    def model_ready(self, model: str, timeout: float = 2.0) -> bool:
        """Whether the server answers ``/v2/models/{model}/ready`` with 200 (False when it is
        not ready, unknown, or the server does not answer)."""
        try:
            with urllib.request.urlopen(f"{self.http_url}/v2/models/{model}/ready",
                                        timeout=timeout) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    @property
    def metrics_url(self) -> str:
        """``http://HOST:PORT/metrics`` (Prometheus text)."""
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def meshd_spec(self) -> str:
        """The agent's ``--triton`` value for this server: its gRPC, metrics and HTTP
        addresses (with ``http=``, replicas advertise the HTTP port to routers)."""
        return f"{self.grpc_url},metrics={self.metrics_url},http={self.host}:{self.http_port}"

    @property
    def pid(self) -> int | None:
        """The ``tritonserver`` process id while it runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def is_running(self) -> bool:
        """True while the ``tritonserver`` process is alive (not necessarily ready)."""
        return self._proc is not None and self._proc.poll() is None

    def child_pids(self) -> list[int]:
        """Live processes of this server's process group, the server itself included (Linux).

        After :meth:`stop` or :meth:`kill` this is empty: no orphaned Python-backend stubs."""
        return group_members(self._proc.pid) if self._proc is not None else []

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines the server wrote since its latest start."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"<TritonServer {self.name} grpc={self.grpc_url} http={self.http_port} {state}>"

    # -- lifecycle

    def start(self, timeout: float = 60) -> None:
        """Launch ``tritonserver`` and wait until ``/v2/health/ready`` answers 200.

        Raises :class:`TritonUnavailable` if Triton cannot run here, and
        :class:`TritonStartError` (with the log tail) if the process dies or is not ready
        within ``timeout`` seconds - it is stopped then. If ports chosen automatically turn out
        to be taken by the time Triton binds them, new ones are chosen and it tries again."""
        self._launch()
        self._wait_ready(timeout)

    def _launch(self) -> None:
        install = find_tritonserver()
        if install is None:
            raise TritonUnavailable(unavailable_reason() or "Triton is unavailable")
        with self._lock:
            if self.is_running():
                raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
            self.work_dir.mkdir(parents=True, exist_ok=True)
            backends = self._backend_dir(install)
            repo = self._repository()
            write_behaviour(self.control_path, self._behaviours)
            self._starts += 1
            # Each start's stubs get their own shared-memory region names (swept in _reap).
            self._shm_prefix = f"meshd{os.getpid()}_{id(self):x}_{self._starts}_"
            cmd = [
                str(install.binary),
                f"--model-repository={repo}",
                f"--backend-directory={backends}",
                f"--id={self.name}",
                f"--grpc-address={self.host}", f"--grpc-port={self.grpc_port}",
                f"--http-address={self.host}", f"--http-port={self.http_port}",
                f"--metrics-address={self.host}", f"--metrics-port={self.metrics_port}",
                "--allow-gpu-metrics=false",
                "--pinned-memory-pool-byte-size=0",
                f"--exit-timeout-secs={self.EXIT_TIMEOUT_S}",
                f"--backend-config=python,shm-region-prefix-name={self._shm_prefix}",
            ]
            if self.explicit:
                cmd.append("--model-control-mode=explicit")
                cmd += [f"--load-model={m}" for m in self.models or []]
            env = install.environment()
            env[CONTROL_ENV] = str(self.control_path)
            with open(self.log_path, "ab") as log:
                self._log_offset = log.tell()
                log.write(f"=== meshd-devtriton {self.name}: {' '.join(cmd)}\n".encode())
                log.flush()
                self._proc = subprocess.Popen(
                    pdeathsig_prefix() + cmd, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, env=env, cwd=self.work_dir,
                    start_new_session=True)
            self._terminated = False
            self._launched_at = time.monotonic()
            _LIVE.add(self)

    def _wait_ready(self, timeout: float, retries: int = 2) -> None:
        proc = self._proc
        assert proc is not None
        deadline = time.monotonic() + timeout
        # Ready = the health endpoint says so *and* /metrics answers: Triton reports ready
        # before it binds the metrics port, and exits if that port is taken.
        urls = [f"{self.http_url}/v2/health/ready", self.metrics_url]
        while True:
            code = proc.poll()
            if code is not None:
                tail = self.log_tail()
                self.stop()
                port_taken = any(e in tail.lower() for e in _BIND_ERRORS)
                if retries > 0 and port_taken and 0 in self._fixed:
                    self.grpc_port, self.http_port, self.metrics_port = self._choose_ports()
                    self._launch()
                    self._wait_ready(max(deadline - time.monotonic(), 5.0), retries - 1)
                    return
                raise TritonStartError(self.name, (
                    f"tritonserver {self.name} exited with code {code} before it was ready; "
                    f"log {self.log_path}:\n{tail}"))
            while urls:
                try:
                    with urllib.request.urlopen(urls[0], timeout=1.0) as resp:
                        if resp.status != 200:
                            break
                except (urllib.error.URLError, OSError):
                    break
                urls.pop(0)
            if not urls and proc.poll() is None:
                self.start_seconds = time.monotonic() - self._launched_at
                return
            if time.monotonic() >= deadline:
                tail = self.log_tail()
                self.stop()
                raise TritonStartError(
                    self.name, f"tritonserver {self.name} not ready after {timeout:.0f} s; "
                    f"log {self.log_path}:\n{tail}")
            time.sleep(0.05)

    def _backend_dir(self, install: TritonInstall) -> Path:
        """``work_dir/backends/python``: symlinks to the backend and this Python's stub."""
        python = self.work_dir / "backends" / "python"
        python.mkdir(parents=True, exist_ok=True)
        links = {
            "libtriton_python.so": install.python_backend_dir / "libtriton_python.so",
            "triton_python_backend_utils.py":
                install.python_backend_dir / "triton_python_backend_utils.py",
            "triton_python_backend_stub": install.stub,
        }
        for name, target in links.items():
            link = python / name
            if link.is_symlink() and Path(os.readlink(link)) == target:
                continue
            with contextlib.suppress(FileNotFoundError):
                link.unlink()
            link.symlink_to(target)
        return python.parent

    def _repository(self) -> Path:
        """The repository to serve: ``repo`` itself, or symlinks to just ``models`` in it."""
        if self.models is None or self.explicit:
            return self.repo
        filtered = self.work_dir / "repository"
        if filtered.exists():
            shutil.rmtree(filtered)
        filtered.mkdir()
        for model in self.models:
            (filtered / model).symlink_to(self.repo / model, target_is_directory=True)
        return filtered

    def stop(self, timeout: float = 10) -> None:
        """Stop the server: SIGTERM, then SIGKILL to its process group after ``timeout`` seconds.

        Returns when the server is reaped and no process of its group (Python-backend stubs)
        is left. Safe to call when it is not running."""
        with self._lock:
            proc = self._proc
            if proc is None:
                return
            if proc.returncode is None and not self._exited(proc, 0):
                self._terminate()
                self._exited(proc, timeout)
            self._reap(proc)

    def _terminate(self) -> None:
        """SIGTERM the server once (Triton then drains for up to ``EXIT_TIMEOUT_S``), after
        telling the models through the control file, so stalled requests let go."""
        with self._lock:
            proc = self._proc
            if proc is not None and proc.returncode is None and not self._terminated:
                self._terminated = True
                write_behaviour(self.control_path, self._behaviours, stopping=True)
                time.sleep(CONTROL_REFRESH_S + 0.01)  # ... and they have read it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the server and its stubs at once (a crashed replica); returns when gone."""
        with self._lock:
            proc = self._proc
            if proc is None:
                return
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            self._reap(proc)

    def restart(self, timeout: float = 60) -> None:
        """Stop (if running) and start again on the same ports, with the same behaviours."""
        self.stop()
        self.start(timeout)

    @staticmethod
    def _exited(proc: subprocess.Popen[bytes], timeout: float) -> bool:
        """Wait up to ``timeout`` s for ``proc`` to exit *without reaping it*.

        While the leader is an unreaped zombie its process group id cannot be reused, so the
        sweep in :meth:`_reap` can never signal an unrelated process."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
            except ChildProcessError:
                return True  # already reaped
            if info is not None:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        """Kill what is left of the group, reap the server, wait for the group to be gone."""
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        elif group_members(proc.pid):
            # Reaped elsewhere (poll()) while stubs lived on: the group still exists, so its id
            # is still theirs.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while group_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        # A killed server leaves its stubs' shared-memory regions (1 MiB each) in /dev/shm.
        if self._shm_prefix and os.path.isdir("/dev/shm"):
            for leftover in Path("/dev/shm").glob(f"{self._shm_prefix}*"):
                with contextlib.suppress(OSError):
                    leftover.unlink()
        _LIVE.discard(self)

    def __enter__(self) -> TritonServer:
        if not self.is_running():
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- behaviour

    def set_behaviour(self, model: str, delay_ms: float = 0, jitter_ms: float = 0,
                      fail: bool = False, stall: bool = False, wait: bool = True,
                      spike_ms: float = 0, spike_rate: float = 0,
                      pauses: Sequence[tuple[float, float]] = ()) -> None:
        """Change how ``model`` behaves on this server, while it runs; all defaults = normal.

        ``delay_ms`` is added to each request's service time, plus ``uniform(0, jitter_ms)``,
        plus ``spike_ms`` on a random ``spike_rate`` share of requests, plus the part of any
        of ``pauses`` (``(start, end)`` on ``time.monotonic()``) it overlaps;
        ``fail`` makes each request return an error; ``stall`` holds requests (and so queues
        the ones behind them) until the behaviour changes, or 60 s. Only models that read the
        control file honour it (``delay`` in ``tests/triton_models``). With ``wait`` (default)
        this returns after the models' refresh interval, so the next request sees the change.
        Kept across :meth:`restart`."""
        entry = behaviour_entry(delay_ms, jitter_ms, fail, stall, spike_ms, spike_rate, pauses)
        with self._lock:
            if entry:
                self._behaviours[model] = entry
            else:
                self._behaviours.pop(model, None)
            write_behaviour(self.control_path, self._behaviours)
        if wait:
            time.sleep(CONTROL_REFRESH_S + 0.01)

    def clear_behaviour(self, model: str | None = None, wait: bool = True) -> None:
        """Back to normal: ``model``, or every model when None."""
        with self._lock:
            if model is None:
                self._behaviours.clear()
            else:
                self._behaviours.pop(model, None)
            write_behaviour(self.control_path, self._behaviours)
        if wait:
            time.sleep(CONTROL_REFRESH_S + 0.01)

    @property
    def behaviours(self) -> dict[str, dict[str, Any]]:
        """A copy of the behaviours set on this server (model -> control-file entry)."""
        with self._lock:
            return {m: dict(b) for m, b in self._behaviours.items()}


def start_all(servers: Sequence[TritonServer], timeout: float = 60) -> None:
    """Start several servers at once (launch all, then wait for each): faster than one by one.

    If one fails, all are stopped and the error is raised."""
    try:
        for server in servers:
            server._launch()
        deadline = time.monotonic() + timeout
        for server in servers:
            server._wait_ready(max(deadline - time.monotonic(), 1.0))
    except BaseException:
        stop_all(servers)
        raise


def stop_all(servers: Iterable[TritonServer], timeout: float = 10) -> None:
    """Stop several servers: SIGTERM to all first, so they drain in parallel."""
    servers = list(servers)
    for server in servers:
        server._terminate()
    for server in servers:
        server.stop(timeout)


# --------------------------------------------------------------------------- CLI


def _server_info(server: TritonServer) -> dict[str, Any]:
    return {"name": server.name, "grpc_url": server.grpc_url, "http_url": server.http_url,
            "metrics_url": server.metrics_url, "control_path": str(server.control_path),
            "log_path": str(server.log_path), "pid": server.pid}


def write_servers_file(work_dir: Path, servers: Sequence[TritonServer]) -> None:
    """``<work_dir>/servers.json``: what ``behave --work-dir`` reads to find the servers."""
    (work_dir / "servers.json").write_text(
        json.dumps([_server_info(s) for s in servers], indent=2) + "\n", encoding="utf-8")


def _run(args: argparse.Namespace) -> int:
    reason = unavailable_reason()
    if reason is not None:
        print(f"meshd-devtriton: Triton is unavailable: {reason}", file=sys.stderr)
        return 1
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="meshd-devtriton-")).resolve()
    models = [m for m in args.models.split(",") if m] if args.models else None
    servers = []
    for i in range(args.count):
        base = args.base_port + PORTS_PER_SERVER * i if args.base_port else 0
        ports = (base, base + 1, base + 2) if base else (0, 0, 0)
        servers.append(TritonServer(args.repo, work / f"triton{i}", host=args.host,
                                    grpc_port=ports[0], http_port=ports[1], metrics_port=ports[2],
                                    models=models, explicit=args.explicit, name=f"triton{i}"))
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        started = time.monotonic()
        start_all(servers, timeout=args.timeout)
        write_servers_file(work, servers)
        print(f"meshd-devtriton: {len(servers)} Triton server(s) ready in "
              f"{time.monotonic() - started:.1f} s (work dir {work}, repo {args.repo})")
        for s in servers:
            print(f"  {s.name}: grpc {s.grpc_url}  http {s.http_url}  metrics {s.metrics_url}")
        print(f"Change a server's behaviour with: meshd-devtriton behave --work-dir {work} "
              f"--server triton0 --model delay --delay-ms 50   (Ctrl-C stops them)", flush=True)
        reported: set[str] = set()
        while not stop.wait(1.0):
            for s in servers:
                if not s.is_running() and s.name not in reported:
                    reported.add(s.name)
                    print(f"meshd-devtriton: {s.name} exited; log {s.log_path}:\n"
                          f"{s.log_tail(10)}", file=sys.stderr, flush=True)
    except TritonStartError as e:
        print(f"meshd-devtriton: {e}", file=sys.stderr)
        return 1
    finally:
        stop_all(servers)
    print("meshd-devtriton: stopped", flush=True)
    return 0


def _behave(args: argparse.Namespace) -> int:
    work = Path(args.work_dir)
    try:
        infos = json.loads((work / "servers.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        print(f"meshd-devtriton: no servers.json in {work}: {e}", file=sys.stderr)
        return 1
    chosen = [i for i in infos if args.server in ("all", i["name"])]
    if not chosen:
        names = ", ".join(i["name"] for i in infos)
        print(f"meshd-devtriton: no server {args.server!r} (have: {names})", file=sys.stderr)
        return 1
    entry = behaviour_entry(args.delay_ms, args.jitter_ms, args.fail, args.stall)
    for info in chosen:
        path = Path(info["control_path"])
        models = read_behaviour(path)
        if entry:
            models[args.model] = entry
        else:
            models.pop(args.model, None)
        write_behaviour(path, models)
        print(f"{info['name']}: {args.model} -> {entry or 'normal'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``meshd-devtriton``: run N real Triton servers on loopback until Ctrl-C or SIGTERM.

    ``meshd-devtriton --count N --base-port P --work-dir DIR [--repo DIR]`` starts servers
    ``triton0..`` with ports gRPC ``P+3i``, HTTP ``P+3i+1``, metrics ``P+3i+2`` (free random
    ports without ``--base-port``), prints their URLs, writes them to ``DIR/servers.json`` and
    stops them all cleanly on exit. ``meshd-devtriton behave --work-dir DIR --server triton1
    --model delay --delay-ms 50 [--jitter-ms J] [--fail] [--stall]`` changes a running server's
    behaviour (no behaviour flags = back to normal)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["behave"]:
        bp = argparse.ArgumentParser(prog="meshd-devtriton behave",
                                     description="Change how a model behaves on running servers.")
        bp.add_argument("--work-dir", required=True, help="the work dir given to meshd-devtriton")
        bp.add_argument("--server", default="all", help="server name (triton0, ...) or 'all'")
        bp.add_argument("--model", default="delay")
        bp.add_argument("--delay-ms", type=float, default=0.0)
        bp.add_argument("--jitter-ms", type=float, default=0.0)
        bp.add_argument("--fail", action="store_true")
        bp.add_argument("--stall", action="store_true")
        return _behave(bp.parse_args(argv[1:]))
    p = argparse.ArgumentParser(
        prog="meshd-devtriton",
        description="Run real Triton servers (from the nvidia-pytriton wheel) on loopback.",
        epilog="Server i listens on gRPC P+3i, HTTP P+3i+1, metrics P+3i+2. "
               "'meshd-devtriton behave --help' changes a running server's behaviour.")
    p.add_argument("--count", type=int, default=1, help="number of servers (default 1)")
    p.add_argument("--base-port", type=int, default=0,
                   help="first port (default: free random ports)")
    p.add_argument("--work-dir", help="logs, control files, servers.json (default: a temp dir)")
    p.add_argument("--repo", type=Path, default=DEFAULT_REPO,
                   help=f"model repository (default {DEFAULT_REPO})")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--models", help="comma-separated models to serve (default: all in --repo)")
    p.add_argument("--explicit", action="store_true",
                   help="--model-control-mode=explicit (load --models at start)")
    p.add_argument("--timeout", type=float, default=120, help="seconds to wait for readiness")
    args = p.parse_args(argv)
    if args.count < 1:
        p.error("--count must be >= 1")
    if args.base_port and not 0 < args.base_port <= 65536 - PORTS_PER_SERVER * args.count:
        p.error("--base-port leaves no room for the servers' ports")
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
