"""Admin RPCs for training jobs (``meshctl jobs``): submit (with streamed progress), get,
list, cancel, and the logs this node keeps.  A mixin of :class:`meshd.admin.server.AdminService`.

A spec is validated here before anything reaches Raft, so a bad one is INVALID_ARGUMENT
naming the field (``gpus.count: ...``); a job no trainer in the mesh could ever hold (more
GPUs than any node has, a GPU type nobody has) is FAILED_PRECONDITION at once, not queued
forever.  Reads come from the answering node's copy of the placements group.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import grpc

from meshd.admin import calls
from meshd.control.plane import ControlPlane
from meshd.train.board import FINAL
from meshd.train.logs import DEFAULT_TAIL, MAX_TAIL, read_tail
from meshd.train.placement import Unplaceable, rank
from meshd.train.scheduler import split_slots
from meshd.train.service import TrainService
from meshd.train.spec import JobSpec, parse_job
from policy.document import load_values
from policy.errors import PolicyError
from policy.model import JOB_STATES, name_check
from policy.records import StoredDoc
from proto.mesh.v1 import admin_pb2

FOLLOW_WAIT = 1.0
_ID = name_check()


def job_status(stored: StoredDoc, version: int) -> admin_pb2.JobStatus:
    s = stored.document.spec
    out = admin_pb2.JobStatus(
        id=stored.document.name, state=s["state"], attempt=s["attempt"], node=s["node"],
        gpus=s["gpus"], progress=s["progress"], step=s["step"], message=s["message"],
        checkpoint=s["checkpoint"], tried=s["tried"], nodes=[p["node"] for p in s["parts"]],
        document_json=json.dumps(stored.to_dict()), version=version)
    if s["loss"] is not None:
        out.loss = s["loss"]
    return out


class JobsAdmin:
    """The jobs half of the admin service (needs ``control`` and ``train``)."""

    control: ControlPlane
    train: TrainService | None

    def _view_job(self, name: str) -> StoredDoc | None:
        return self.control.views["placements"].store.get("TrainingJob", name)

    async def SubmitJob(self, request: admin_pb2.SubmitJobRequest,  # noqa: N802 - gRPC name
                        context: grpc.aio.ServicerContext) -> AsyncIterator[admin_pb2.JobStatus]:
        try:
            raws = load_values(request.spec, "spec")
            if len(raws) != 1:
                raise PolicyError("spec", f"must hold exactly one job, got {len(raws)}")
            spec = parse_job(raws[0])
        except PolicyError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise AssertionError("unreachable") from None
        timeout = await calls.timeout(request.timeout_seconds, context)
        if self.train is not None:
            why = _never_fits(spec, self.train)
            if why:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, why)
        result = await calls.commit(self.control, context, "placements", {
            "op": "submit", "job": spec.doc, "author": calls.caller(), "at": time.time()}, timeout)
        version = int(result.get("version", 0))
        view = self.control.views["placements"]
        last = -1
        while True:
            stored = self._view_job(spec.id)
            if stored is not None and stored.version != last:
                last = stored.version
                yield job_status(stored, view.version)
                if not request.follow or stored.document.spec["state"] in FINAL:
                    return
            elif stored is None and view.version >= version:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"job {spec.id!r} vanished")
            await view.wait_beyond(view.version, FOLLOW_WAIT)

    async def GetJob(self, request: admin_pb2.JobRequest,  # noqa: N802
                     context: grpc.aio.ServicerContext) -> admin_pb2.JobStatus:
        stored = await self._existing(request.id, context)
        return job_status(stored, self.control.views["placements"].version)

    async def ListJobs(self, request: admin_pb2.ListJobsRequest,  # noqa: N802
                       context: grpc.aio.ServicerContext) -> admin_pb2.ListJobsResponse:
        bad = [s for s in request.state if s not in JOB_STATES]
        if bad:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"state: unknown state {bad[0]!r}; expected one of "
                                f"{', '.join(JOB_STATES)}")
        view = self.control.views["placements"]
        jobs = [job_status(d, view.version) for d in view.store.list("TrainingJob")
                if not request.state or d.document.spec["state"] in request.state]
        return admin_pb2.ListJobsResponse(jobs=jobs)

    async def CancelJob(self, request: admin_pb2.JobRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> admin_pb2.JobStatus:
        await self._existing(request.id, context)
        timeout = await calls.timeout(request.timeout_seconds, context)
        result = await calls.commit(self.control, context, "placements", {
            "op": "cancel", "job": request.id, "author": calls.caller(), "at": time.time()},
            timeout)
        stored = self._view_job(request.id)
        assert stored is not None
        return job_status(stored, int(result.get("version", 0)))

    async def JobLogs(self, request: admin_pb2.JobLogsRequest,  # noqa: N802
                      context: grpc.aio.ServicerContext) -> admin_pb2.JobLogsResponse:
        try:
            _ID(request.id, "id")
        except PolicyError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if request.tail_bytes > MAX_TAIL:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"tail_bytes: at most {MAX_TAIL}, got {request.tail_bytes}")
        node = self.control.node
        found = None
        if self.train is not None:
            found = read_tail(self.train.data_dir / "jobs" / request.id, request.attempt,
                              request.tail_bytes or DEFAULT_TAIL)
        if found is None:
            stored = self._view_job(request.id)
            ran = ""
            if stored is not None and stored.document.spec["ran_on"]:
                ran = "; its attempts ran on " + ", ".join(
                    f"{n} (attempt {stored.document.spec['attempt'] - k})" for k, n in
                    enumerate(reversed(stored.document.spec["ran_on"])))
            which = f"attempt {request.attempt} of " if request.attempt else ""
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"id: no log of {which}job {request.id!r} on {node}{ran}")
        assert found is not None
        return admin_pb2.JobLogsResponse(node=node, attempt=found.attempt, data=found.data,
                                         truncated=found.truncated, attempts=found.attempts)

    async def _existing(self, name: str, context: grpc.aio.ServicerContext) -> StoredDoc:
        try:
            _ID(name, "id")
        except PolicyError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        stored = self._view_job(name)
        if stored is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"id: no job {name!r}")
        assert stored is not None
        return stored


def _never_fits(spec: JobSpec, train: TrainService) -> str:
    """Why no trainer the mesh has could ever run the job ("" if one could)."""
    trainers = train.trainers()
    if not trainers:
        return "no trainer in the mesh (start meshd --role trainer)"
    try:
        rank(spec.needs(), split_slots(trainers)[spec.cpu_only], limit=1)
    except Unplaceable as exc:
        return f"gpus.count: {exc}"
    tenant = spec.doc["tenant"]
    limit = train.quotas().get(tenant)
    if limit is not None and spec.slots > limit:
        return (f"gpus.count: tenant {tenant!r} may hold {limit} GPU(s) for training at once "
                f"(TenantQuota training_gpus); the job needs {spec.slots}")
    return ""
