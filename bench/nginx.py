"""Debian's nginx, started by a benchmark as the current user: the front door Triton
deployments put before their servers today, run beside meshd as a baseline.

``Nginx(workdir, grpc=[...], http=[...], balance="least_conn")`` writes a config with one
upstream per protocol (``grpc_pass`` over HTTP/2, ``proxy_pass`` over HTTP/1.1, upstream
connections kept alive and never recycled), starts it in the foreground in its own process
group (killed with the bench, ``PR_SET_PDEATHSIG``), and waits until it listens.  No root
needed; as root its workers run as the invoking user rather than ``nobody``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.table import proc_cpu_s

NGINX = "/usr/sbin/nginx"

CONF = """\
daemon off;
master_process on;
worker_processes 1;
{user}pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 1000000;
    client_max_body_size 64m;
    grpc_read_timeout 600s;
    proxy_read_timeout 600s;
{servers}}}
"""

SERVER = """\
    upstream {name} {{ {balance}{members} keepalive 64; keepalive_requests 1000000; }}
    server {{
        listen 127.0.0.1:{port}{http2};
        location / {{ {pass_} }}
    }}
"""


def installed() -> bool:
    return os.access(NGINX, os.X_OK)


def version() -> str:
    try:
        out = subprocess.run([NGINX, "-v"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return (out.stderr or out.stdout).strip().removeprefix("nginx version: ")


class Nginx:
    """One nginx master with one worker; ``grpc_addr`` / ``http_addr`` where it listens."""

    def __init__(self, workdir: Path, grpc: Sequence[str] = (), http: Sequence[str] = (),
                 balance: str = "", name: str = "nginx") -> None:
        from meshd.dev.ports import pick_ports
        from meshd.dev.processes import pdeathsig_prefix

        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        user = ""
        if os.geteuid() == 0:  # else nginx's workers would switch to nobody
            import grp
            import pwd

            user = (f"user {pwd.getpwuid(os.getuid()).pw_name} "
                    f"{grp.getgrgid(os.getgid()).gr_name};\n")
        ports = pick_ports("127.0.0.1", 2)
        servers = ""
        self.grpc_addr = self.http_addr = ""
        for proto, ups, port in (("grpc", grpc, ports[0]), ("http", http, ports[1])):
            if not ups:
                continue
            members = "".join(f" server {u};" for u in ups)
            pass_ = ("grpc_pass grpc://triton_grpc;" if proto == "grpc" else
                     'proxy_pass http://triton_http; proxy_http_version 1.1; '
                     'proxy_set_header Connection "";')
            servers += SERVER.format(name=f"triton_{proto}", members=members, port=port,
                                     balance=f"{balance};" if balance else "",
                                     http2=" http2" if proto == "grpc" else "", pass_=pass_)
            setattr(self, f"{proto}_addr", f"127.0.0.1:{port}")
        self.conf = CONF.format(user=user, dir=self.dir, servers=servers)
        path = self.dir / "nginx.conf"
        path.write_text(self.conf)
        self.out = open(self.dir / "stderr.log", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*pdeathsig_prefix(), NGINX, "-p", str(self.dir), "-c", str(path), "-e",
             str(self.dir / "error.log")], stdin=subprocess.DEVNULL, stdout=self.out,
            stderr=self.out, start_new_session=True)
        self.pid = self.proc.pid
        end = time.monotonic() + 15
        for addr in (self.grpc_addr, self.http_addr):
            if not addr:
                continue
            port = int(addr.rsplit(":", 1)[1])
            while True:
                if self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"nginx exited ({self.proc.returncode}): "
                                       f"{self.log_tail()}")
                try:
                    socket.create_connection(("127.0.0.1", port), 1).close()
                    break
                except OSError:
                    if time.monotonic() > end:
                        self.stop()
                        raise RuntimeError(f"nginx never listened: {self.log_tail()}") from None
                    time.sleep(0.05)

    def log_tail(self) -> str:
        text = ""
        for name in ("stderr.log", "error.log"):
            with contextlib.suppress(OSError):
                text += (self.dir / name).read_text(errors="replace")
        return " | ".join(text.strip().splitlines()[-3:])

    def pids(self) -> list[int]:
        from meshd.dev.processes import group_members

        return group_members(self.pid) or [self.pid]

    def cpu(self) -> dict[str, Any]:
        return {"cpu": sum(proc_cpu_s(p) or 0.0 for p in self.pids())}

    def stop(self) -> dict[str, Any]:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.out.close()
        return {"returncode": self.proc.returncode}
