"""Job logs: the per-attempt files a trainer keeps, and the ``JobLogs`` RPC's input checks
(real mTLS admin server in process; a fuzzed id or size is INVALID_ARGUMENT or NOT_FOUND,
never a path outside the jobs directory and never INTERNAL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from hypothesis import given, settings
from hypothesis import strategies as st

from meshd.train.logs import MAX_TAIL, attempts, log_path, read_tail
from proto.mesh.v1 import admin_pb2
from tests.test_policy_api import Server, run


def test_read_tail_picks_the_attempt_and_cuts_from_the_end(tmp_path: Path) -> None:
    assert read_tail(tmp_path) is None
    log_path(tmp_path, 2).write_bytes(b"second\n" * 10)
    log_path(tmp_path, 10).write_bytes(b"tenth line\n")
    (tmp_path / "attempt-x.log").write_text("not an attempt")
    assert attempts(tmp_path) == [2, 10]
    latest = read_tail(tmp_path)
    assert latest is not None and latest.attempt == 10 and latest.data == b"tenth line\n"
    assert not latest.truncated and latest.attempts == [2, 10]
    cut = read_tail(tmp_path, 2, tail=10)
    assert cut is not None and cut.truncated and cut.data == b"nd\nsecond\n"
    assert read_tail(tmp_path, 3) is None


def test_job_logs_checks_its_input(tmp_path: Path) -> None:
    async def body(srv: Server) -> None:
        code, msg = await srv.code("JobLogs", admin_pb2.JobLogsRequest(id="../../etc"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and msg.startswith("id"), msg
        code, msg = await srv.code("JobLogs", admin_pb2.JobLogsRequest(
            id="ok", tail_bytes=MAX_TAIL + 1))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "tail_bytes" in msg, msg
        code, msg = await srv.code("JobLogs", admin_pb2.JobLogsRequest(id="ok"))
        assert code == grpc.StatusCode.NOT_FOUND and "no log of job 'ok' on a" in msg, msg
        viewer = srv.mint("val", ["viewer"])
        code, _ = await srv.code("JobLogs", admin_pb2.JobLogsRequest(id="ok"), viewer)
        assert code == grpc.StatusCode.NOT_FOUND  # read-only: viewers may read logs

    run(tmp_path, body)


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=80), st.integers(0, 2 * MAX_TAIL), st.integers(0, (1 << 32) - 1))
def test_job_logs_fuzz(tmp_path_factory: Any, job: str, tail: int, attempt: int) -> None:
    tmp = tmp_path_factory.mktemp("logs")

    async def body(srv: Server) -> None:
        code, msg = await srv.code("JobLogs", admin_pb2.JobLogsRequest(
            id=job, tail_bytes=tail, attempt=attempt))
        assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), msg
        assert msg

    run(tmp, body)
