"""System shared memory through a router on the client's host.

Triton's system shared memory extension lets a client on the server's host hand tensors over
in a POSIX shared memory region instead of the request: it registers the region (name, key,
offset, size), then names it in an input's or output's parameters.  Through a router the
region lives on the router's host, not on whichever replica serves the request, so the router
does the server's part: it reads the inputs from the region and sends their bytes upstream,
and writes the outputs Triton returns into the region (answering, as Triton does, with an
empty ``raw_output_contents`` entry for each).  Shared-memory clients work unchanged.

Only clients on the router's host may register regions (a remote client could otherwise make
the router read or write any shared memory segment of its host), and a key must name a
segment under ``/dev/shm``.  Registrations are files in a directory shared by the router's
processes (one file per region, written whole and renamed into place), so a region registered
through one worker process serves requests arriving at another.  CUDA shared memory is device
memory of one GPU server: see ``kserve.NO_SERVER_METHODS``.

Messages and codes are Triton 2.51's.
"""

from __future__ import annotations

import json
import mmap
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from meshd.router.gateway import Caller, Gateway, RouterError
from meshd.router.traces import RequestTrace

SHM_DIR = Path("/dev/shm")
REGION = "shared_memory_region"
SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
MAX_REGIONS = 1024


@dataclass(slots=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    view: mmap.mmap
    stamp: tuple[int, int] = (0, 0)
    """The registration file's (inode, mtime ns) this was loaded from."""

    def status(self) -> service_pb2.SystemSharedMemoryStatusResponse.RegionStatus:
        return service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(
            name=self.name, key=self.key, offset=self.offset, byte_size=self.byte_size)


def is_local(peer: str) -> bool:
    """Whether a gRPC peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``,
    ``unix:...``) or an HTTP remote address is on this host."""
    if peer.startswith("unix:") or peer in ("", "::1", "127.0.0.1"):
        return True
    host = peer.split(":", 1)[1] if peer.startswith(("ipv4:", "ipv6:")) else peer
    host = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.startswith("[") else host
    host = host.strip("[]")
    return host == "::1" or host.startswith("127.") or host == "localhost"


def _open(key: str, offset: int, byte_size: int) -> mmap.mmap:
    name = key[1:] if key.startswith("/") else key
    if not name or "/" in name or name in (".", ".."):
        raise RouterError(grpc.StatusCode.INTERNAL,
                          f"Unable to open shared memory region: '{key}'")
    try:
        fd = os.open(SHM_DIR / name, os.O_RDWR)
    except OSError:
        raise RouterError(grpc.StatusCode.INTERNAL,
                          f"Unable to open shared memory region: '{key}'") from None
    try:
        size = os.fstat(fd).st_size
        if offset < 0 or byte_size < 0 or offset + byte_size > size or size == 0:
            raise RouterError(grpc.StatusCode.INTERNAL,
                              f"Invalid shared memory region: '{key}'")
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


class Regions:
    """The system shared memory regions registered with this router (all its processes,
    when ``directory`` is given; this process alone otherwise)."""

    def __init__(self, gateway: Gateway, directory: Path | None = None) -> None:
        self.gateway = gateway
        self.directory = directory
        self._regions: dict[str, Region] = {}
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)

    # --- registration -------------------------------------------------------------------------

    def _file(self, name: str) -> Path:
        assert self.directory is not None
        return self.directory / (name.encode().hex() + ".json")

    def register(self, name: str, key: str, offset: int, byte_size: int, peer: str) -> None:
        if not is_local(peer):
            raise RouterError(grpc.StatusCode.PERMISSION_DENIED,
                              "system shared memory through a router is for clients on the "
                              "router's host")
        if self.lookup(name) is not None:
            raise RouterError(grpc.StatusCode.ALREADY_EXISTS,
                              f"shared memory region '{name}' already in manager")
        if len(self._names()) >= MAX_REGIONS:
            raise RouterError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"at most {MAX_REGIONS} shared memory regions")
        view = _open(key, offset, byte_size)
        region = Region(name, key, offset, byte_size, view)
        if self.directory is not None:
            body = json.dumps({"name": name, "key": key, "offset": offset,
                               "byte_size": byte_size}).encode()
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            os.replace(tmp, self._file(name))
            st = self._file(name).stat()
            region.stamp = (st.st_ino, st.st_mtime_ns)
        self._regions[name] = region

    def unregister(self, name: str) -> None:
        """Forget ``name`` (every region when empty); unknown names are no error."""
        for each in [name] if name else self._names():
            region = self._regions.pop(each, None)
            if region is not None:
                region.view.close()
            if self.directory is not None:
                self._file(each).unlink(missing_ok=True)

    def status(self, name: str) -> service_pb2.SystemSharedMemoryStatusResponse:
        out = service_pb2.SystemSharedMemoryStatusResponse()
        names = [name] if name else self._names()
        for each in names:
            region = self.lookup(each)
            if region is None:
                if name:
                    raise RouterError(grpc.StatusCode.NOT_FOUND, "Unable to find system shared "
                                                                 f"memory region: '{name}'")
                continue
            out.regions[each].CopyFrom(region.status())
        return out

    def _names(self) -> list[str]:
        if self.directory is None:
            return list(self._regions)
        names = []
        for path in self.directory.glob("*.json"):
            try:
                names.append(bytes.fromhex(path.stem).decode())
            except ValueError:
                continue
        return sorted(names)

    def lookup(self, name: str) -> Region | None:
        """The region registered as ``name`` (by any of the router's processes)."""
        region = self._regions.get(name)
        if self.directory is None:
            return region
        try:
            st = self._file(name).stat()
        except OSError:
            if region is not None:
                del self._regions[name]
                region.view.close()
            return None
        if region is not None and region.stamp == (st.st_ino, st.st_mtime_ns):
            return region
        try:
            spec = json.loads(self._file(name).read_bytes())
            fresh = Region(spec["name"], spec["key"], int(spec["offset"]),
                           int(spec["byte_size"]),
                           _open(spec["key"], int(spec["offset"]), int(spec["byte_size"])),
                           (st.st_ino, st.st_mtime_ns))
        except (OSError, ValueError, KeyError, TypeError, RouterError):
            return None
        if region is not None:
            region.view.close()
        self._regions[name] = fresh
        return fresh

    # --- inference ----------------------------------------------------------------------------

    def _slice(self, params: Any) -> tuple[Region, int, int]:
        name = params[REGION].string_param
        region = self.lookup(name)
        if region is None:
            raise RouterError(grpc.StatusCode.NOT_FOUND,
                              f"Unable to find shared memory region: '{name}'")
        size = params[SIZE].int64_param if SIZE in params else 0
        offset = params[OFFSET].int64_param if OFFSET in params else 0
        if offset < 0 or size < 0 or offset + size > region.byte_size:
            raise RouterError(grpc.StatusCode.INVALID_ARGUMENT, "Invalid offset + byte size for "
                                                                f"shared memory region: '{name}'")
        return region, region.offset + offset, size

    async def infer(self, req: service_pb2.ModelInferRequest, caller: Caller,
                    remaining: float | None, rt: RequestTrace | None) -> bytes:
        """``req`` with its shared-memory inputs read into the request and its shared-memory
        outputs written to their regions (see the module doc).  A request refused here, before
        it reaches the gateway, is counted here (invalid, or failed by its status)."""
        try:
            req, targets = self._read_inputs(req)
        except RouterError as err:
            if err.code == grpc.StatusCode.INVALID_ARGUMENT:
                self.gateway.counters.invalid += 1
            else:
                self.gateway.failed(err.code.name)
            raise
        reply = await self.gateway.infer(req.SerializeToString(), req, caller, remaining, rt,
                                         shm=True)
        return self._write_outputs(reply, targets) if targets else reply

    def _read_inputs(self, req: service_pb2.ModelInferRequest
                     ) -> tuple[service_pb2.ModelInferRequest,
                                dict[str, tuple[Region, int, int]]]:
        """``req`` with its inputs' regions read into ``raw_input_contents`` and every region
        parameter removed; where each shared-memory output goes."""
        inputs = req.inputs
        raw = list(req.raw_input_contents)
        if raw and len(raw) != len(inputs):
            raw = []  # let validation name the problem as Triton would
        elif not raw:
            raw = [b""] * len(inputs)
        for i in range(len(inputs)):
            tensor = inputs[i]
            params = tensor.parameters
            if params and REGION in params:
                if tensor.HasField("contents"):
                    raise RouterError(grpc.StatusCode.INVALID_ARGUMENT,
                                      "contents field must not be specified with a shared "
                                      f"memory region for '{tensor.name}'")
                region, start, size = self._slice(params)
                raw[i] = region.view[start:start + size]
                for key in (REGION, SIZE, OFFSET):
                    if key in params:
                        del params[key]
            elif tensor.HasField("contents") and not req.raw_input_contents:
                raise RouterError(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"input '{tensor.name}': explicit contents cannot be mixed "
                                  "with shared memory inputs through a router; send its data "
                                  "in raw_input_contents")
        if raw:
            del req.raw_input_contents[:]
            req.raw_input_contents.extend(raw)
        targets: dict[str, tuple[Region, int, int]] = {}
        for out in req.outputs:
            params = out.parameters
            if params and REGION in params:
                targets[out.name] = self._slice(params)
                for key in (REGION, SIZE, OFFSET):
                    if key in params:
                        del params[key]
        return req, targets

    @staticmethod
    def _write_outputs(reply: bytes, targets: dict[str, tuple[Region, int, int]]) -> bytes:
        """Each shared-memory output of ``reply`` written to its region, its entry emptied."""
        resp = service_pb2.ModelInferResponse.FromString(reply)
        contents = resp.raw_output_contents
        for i, out in enumerate(resp.outputs):
            where = targets.get(out.name)
            if where is None or i >= len(contents):
                continue
            region, start, size = where
            data = contents[i]
            if len(data) > size:
                raise RouterError(grpc.StatusCode.INTERNAL,
                                  f"shared memory size specified with the request for output "
                                  f"'{out.name}' ({size} bytes) should be at least "
                                  f"{len(data)} bytes to hold the results")
            region.view[start:start + len(data)] = data
            contents[i] = b""
        return resp.SerializeToString()
