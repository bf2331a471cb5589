"""``meshctl jobs``: submit, follow, list, show, cancel training jobs, and read their logs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from meshd.ctl.text import read_file_arg
from proto.mesh.v1 import admin_pb2, admin_pb2_grpc


def _line(s: admin_pb2.JobStatus) -> str:
    loss = f" loss={s.loss:.4g}" if s.HasField("loss") else ""
    where = f" on {','.join(s.nodes) or s.node}" if s.node else ""
    return (f"{s.id}: {s.state}{where} attempt={s.attempt} step={s.step} "
            f"progress={s.progress:.0%}{loss}  {s.message}")


def submit(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    text = read_file_arg(args.file)
    if text is None:
        return 2
    stream = stub.SubmitJob(admin_pb2.SubmitJobRequest(
        spec=text, follow=args.follow, timeout_seconds=args.timeout),
        timeout=None if args.follow else args.timeout + 1)
    last: admin_pb2.JobStatus | None = None
    for status in stream:
        last = status
        print(_line(status), flush=True)
    return 0 if last is None or last.state not in ("failed", "cancelled") else 1


def get(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    s = stub.GetJob(admin_pb2.JobRequest(id=args.id), timeout=args.timeout + 1)
    if args.format == "json":
        print(json.dumps(json.loads(s.document_json), indent=2))
    else:
        print(_line(s))
        if s.checkpoint:
            print(f"  checkpoint: {s.checkpoint}")
        if s.tried:
            print(f"  leases lapsed on: {', '.join(s.tried)}")
    return 0


def list_jobs(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    resp = stub.ListJobs(admin_pb2.ListJobsRequest(state=args.state or []),
                         timeout=args.timeout + 1)
    if args.format == "json":
        print(json.dumps([json.loads(s.document_json) for s in resp.jobs], indent=2))
        return 0
    for s in resp.jobs:
        print(_line(s))
    return 0


def cancel(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    s = stub.CancelJob(admin_pb2.JobRequest(id=args.id, timeout_seconds=args.timeout),
                       timeout=args.timeout + 1)
    print(_line(s))
    return 0


def logs(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    """An attempt's output, from the node that ran it (found through the job's record and
    the member list); with ``--data-dir``, every attempt's log in that directory."""
    s = stub.GetJob(admin_pb2.JobRequest(id=args.id), timeout=args.timeout + 1)
    ran_on = json.loads(s.document_json)["spec"]["ran_on"]
    attempt = args.attempt or s.attempt
    index = attempt - (s.attempt - len(ran_on)) - 1
    if not 0 <= index < len(ran_on) or attempt > s.attempt:
        print(f"meshctl: job {args.id!r} has no attempt {attempt} on record (attempts: "
              f"{s.attempt})", file=sys.stderr)
        return 1
    node = args.node or ran_on[index]  # rank 0's, unless another rank's is asked for
    members = stub.Members(admin_pb2.MembersRequest(), timeout=args.timeout + 1).members
    member = next((m for m in members if m.name == node), None)
    if member is None or "admin" not in member.ports:
        print(f"meshctl: attempt {attempt} of {args.id!r} ran on {node}, which is not a "
              "member now (or has no admin port); its log stays in that node's --data-dir",
              file=sys.stderr)
        return 1
    host = member.address.rsplit(":", 1)[0]
    target = f"{host}:{member.ports['admin']}"
    with args.open_channel(target, node) as channel:
        resp = admin_pb2_grpc.AdminStub(channel).JobLogs(admin_pb2.JobLogsRequest(
            id=args.id, attempt=attempt, tail_bytes=args.tail), timeout=args.timeout + 1)
    cut = f", the last {len(resp.data)} bytes" if resp.truncated else ""
    print(f"==> attempt-{resp.attempt}.log on {resp.node}{cut} <==", file=sys.stderr)
    sys.stdout.write(resp.data.decode(errors="replace"))
    return 0


def local_logs(args: argparse.Namespace) -> int:
    """The job's output on this machine (the trainer keeps it in its data directory)."""
    directory = Path(args.data_dir) / "jobs" / args.id
    files = sorted(directory.glob("attempt-*.log"),
                   key=lambda p: int(p.stem.removeprefix("attempt-")))
    if not files:
        print(f"meshctl: no logs of job {args.id!r} under {directory} (they stay on the "
              "trainer that ran it)", file=sys.stderr)
        return 1
    for path in files:
        print(f"==> {path.name} <==")
        sys.stdout.write(path.read_text(errors="replace"))
    return 0


def add_commands(sub: Any) -> None:
    """Add ``meshctl jobs ...`` to ``meshctl``'s subparsers."""
    jobs = sub.add_parser("jobs", help="training jobs")
    jsub = jobs.add_subparsers(dest="jobs_command", required=True)
    s = jsub.add_parser("submit", help="submit a job spec (JSON or YAML)")
    s.add_argument("-f", "--file", required=True, help="the spec, or - for stdin")
    s.add_argument("--follow", action="store_true", help="stream progress until it ends")
    s.set_defaults(func=submit)
    g = jsub.add_parser("get", help="one job's state")
    g.add_argument("id")
    g.add_argument("--format", choices=["text", "json"], default="text")
    g.set_defaults(func=get)
    ls = jsub.add_parser("list", help="every job the answering node knows")
    ls.add_argument("--state", action="append", help="only jobs in this state (repeatable)")
    ls.add_argument("--format", choices=["text", "json"], default="text")
    ls.set_defaults(func=list_jobs)
    c = jsub.add_parser("cancel", help="cancel a job (a running one is stopped by its trainer)")
    c.add_argument("id")
    c.set_defaults(func=cancel)
    lg = jsub.add_parser("logs", help="a job's output, from the trainer that ran it")
    lg.add_argument("id")
    lg.add_argument("--attempt", type=int, default=0, help="which attempt (default: latest)")
    lg.add_argument("--node", default="",
                    help="the node whose log to read (a gang's other ranks; default: the "
                         "node of rank 0)")
    lg.add_argument("--tail", type=int, default=0,
                    help="bytes from the end (default 64 KiB, at most 4 MiB)")
    lg.add_argument("--data-dir", help="read every attempt's log from this trainer "
                                       "--data-dir instead (offline, on that machine)")
    lg.set_defaults(func=logs, offline_if=("data_dir", local_logs))
