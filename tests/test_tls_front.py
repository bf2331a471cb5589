"""Refused TLS handshakes are counted and audited on the admin port (the TLS front,
:mod:`meshd.security.front`), the router's HTTPS port (:mod:`meshd.security.https`) and, with
the front turned on, the router's gRPC port.  Real TLS, real mesh certificates, in process."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import shutil
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from certs import tls
from certs.ca import CertificateAuthority
from certs.spiffe import SpiffeId
from gossip.config import Config
from gossip.protocol import Swim
from gossip.state import NodeMeta
from meshd.coordinates import CoordinatePlane
from meshd.ctl.diagnose import explain
from meshd.dev.ports import free_port
from meshd.metrics.routing import RoutingCollector
from meshd.router import server as router_server
from meshd.router.auth import ClientAuth
from meshd.router.counters import RouterCounters
from meshd.router.gateway import Gateway
from meshd.router.scoring import LocalScoring
from meshd.score.scorer import Scorer
from meshd.security.audit import AuditLog
from meshd.security.front import REASONS, FrontedServer, Refusal, TlsFront, server_context
from meshd.security.https import CountedTlsSite
from meshd.security.plane import Security
from meshd.signals.fused import FusedState
from proto.mesh.v1 import admin_pb2, admin_pb2_grpc
from testbed.admin import admin_channel, dev_security, start_admin

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes((0, 0, 0, 4, 0, 0, 0, 0, 0))
NOT_A_HELLO = bytes((0x16, 3, 1, 0, 5, 1, 2, 3, 4, 5))
"""A TLS handshake record holding no ClientHello: TLS, but broken (``other``)."""


class Ids:
    """Every kind of client identity the tests present, minted once."""

    def __init__(self, root: Path) -> None:
        self.sec = dev_security(root / "a", "a")
        ca = self.sec.ca
        assert ca is not None
        stranger = CertificateAuthority.create("mesh.test")
        self.bundle = (root / "a" / "meshctl" / "bundle.pem").read_bytes()

        def mint(name: str, authority: CertificateAuthority, roles: list[str] | None = None,
                 trust_ours: bool = True, **kw: object) -> Path:
            out = root / f"id-{name}"
            authority.mint(SpiffeId("mesh.test", "user", name), roles or ["admin"],
                           **kw).save(out)  # type: ignore[arg-type]
            if trust_ours:
                shutil.copy(root / "a" / "meshctl" / "bundle.pem", out / "bundle.pem")
            return out

        self.good = root / "a" / "meshctl"
        self.viewer = mint("vera", ca, ["viewer"])
        self.foreign = mint("eve", stranger)  # trusts us; we do not trust it
        self.elsewhere = mint("mallory", stranger, trust_ours=False)  # trusts only its CA
        self.expired = mint("old", ca, lifetime=dt.timedelta(hours=1), now=time.time() - 7200)
        self.early = mint("early", ca, now=time.time() + 7200)

    def context(self, creds: Path | None, *, with_cert: bool = True) -> ssl.SSLContext:
        if creds is None or not with_cert:
            ctx = tls.client_context(None, bundle_pem=self.bundle)
        else:
            ctx = tls.client_context(creds)
        ctx.set_alpn_protocols(["h2"])
        return ctx


@pytest.fixture(scope="module")
def ids(tmp_path_factory: pytest.TempPathFactory) -> Ids:
    return Ids(tmp_path_factory.mktemp("front"))


def attempt(port: int, ctx: ssl.SSLContext | None, payload: bytes = H2_PREFACE,
            timeout: float = 5.0) -> str:
    """One connection: ``open`` (the server answered), ``closed``, or what TLS said."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
        if ctx is None:
            raw.sendall(payload)
            try:
                data = raw.recv(64)
            except OSError as exc:
                return type(exc).__name__
            return "closed" if not data else "alert" if data[0] == 0x15 else "open"
        try:
            with ctx.wrap_socket(raw) as conn:
                conn.sendall(payload)
                return "open" if conn.recv(9) else "closed"
        except ssl.SSLError as exc:
            return str(exc.reason)
        except OSError as exc:
            return type(exc).__name__


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


def audited(path: Path, channel: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines())
            if r.get("channel") == channel]


def _plane() -> CoordinatePlane:
    return CoordinatePlane("a", place_of=lambda n: None)


def _swim() -> Swim:
    return Swim(Config.local(), "a", ("127.0.0.1", 7000), NodeMeta.build([], "", "", {}, {}),
                now=0.0)


# --- the admin port ---------------------------------------------------------------------------


def test_admin_port_counts_and_audits_every_refused_handshake(ids: Ids) -> None:
    sec = ids.sec
    log = sec.dir / "audit.log"

    async def scenario() -> None:
        port = free_port()
        server = await start_admin(_swim(), lambda: 0.0, _plane(), sec, port)
        assert isinstance(server, FrontedServer)
        server.front.handshake_timeout = 0.5
        loop = asyncio.get_running_loop()

        async def refused(reason: str, ctx: ssl.SSLContext | None, payload: bytes = H2_PREFACE,
                          client_sees: str | None = None) -> None:
            before = sec.refusals[("admin", reason)]
            n_audit = len([r for r in audited(log, "admin") if r["reason"] == reason])
            seen = await loop.run_in_executor(None, attempt, port, ctx, payload)
            assert seen != "open", (reason, seen)
            if client_sees is not None:
                assert seen == client_sees, (reason, seen)
            await until(lambda: sec.refusals[("admin", reason)] == before + 1)
            records = [r for r in audited(log, "admin") if r["reason"] == reason]
            assert len(records) == n_audit + 1, records
            assert records[-1]["peer"].startswith("ipv4:127.0.0.1:")
            assert not records[-1]["allowed"] and records[-1]["method"] == "TLS handshake"

        try:
            # A good client still gets in, through RBAC that reads the front's table.
            async with admin_channel(sec, port) as ch:
                who = await admin_pb2_grpc.AdminStub(ch).Whoami(admin_pb2.WhoamiRequest(),
                                                                timeout=5)
            assert who.principal == "spiffe://mesh.test/user/admin"
            from certs.identity import Identity
            async with admin_channel(sec, port, Identity.load(ids.viewer)) as ch:
                stub = admin_pb2_grpc.AdminStub(ch)
                await stub.Members(admin_pb2.MembersRequest(), timeout=5)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.TokenCreate(admin_pb2.TokenCreateRequest(), timeout=5)
                assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "spiffe://mesh.test/user/vera" in (err.value.details() or "")
            # The client is told why by a TLS alert (meshctl's diagnose reads it).
            await refused("no_client_certificate", ids.context(ids.good, with_cert=False),
                          client_sees="TLSV13_ALERT_CERTIFICATE_REQUIRED")
            await refused("unknown_ca", ids.context(ids.foreign),
                          client_sees="TLSV1_ALERT_UNKNOWN_CA")
            await refused("certificate_expired", ids.context(ids.expired),
                          client_sees="SSLV3_ALERT_CERTIFICATE_EXPIRED")
            await refused("certificate_not_yet_valid", ids.context(ids.early))
            await refused("client_refused_our_certificate", ids.context(ids.elsewhere),
                          client_sees="CERTIFICATE_VERIFY_FAILED")
            await refused("plaintext", None, H2_PREFACE)
            await refused("plaintext", None, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            await refused("other", None, NOT_A_HELLO)
            await refused("handshake_timeout", None, b"")
            # gRPC in plaintext on the TLS port: UNAVAILABLE for it, "plaintext" for us.
            before = sec.refusals[("admin", "plaintext")]
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await admin_pb2_grpc.AdminStub(ch).Whoami(admin_pb2.WhoamiRequest(),
                                                              timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            await until(lambda: sec.refusals[("admin", "plaintext")] > before)
            # Revoked: TLS accepts it; the call is refused, counted and audited as before.
            sec.revoke(SpiffeId("mesh.test", "user", "vera"))
            async with admin_channel(sec, port, Identity.load(ids.viewer)) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await admin_pb2_grpc.AdminStub(ch).Members(admin_pb2.MembersRequest(),
                                                               timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "revoked" in (err.value.details() or "")
            assert sec.refusals[("admin", "revoked")] >= 1
            # Every splice connection is gone from the table once its client is.
            # A splice's table entry lives as long as its connection (gRPC's channels may
            # keep theirs a while: a raw client shows it).
            held = len(server.front.peers)
            reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                          ssl=ids.context(ids.good))
            writer.write(H2_PREFACE)
            assert await reader.read(9)
            await until(lambda: len(server.front.peers) == held + 1)
            writer.close()
            await until(lambda: len(server.front.peers) == held)
        finally:
            await server.stop(0)
        assert not server.front.connections and not server.front.pending

    asyncio.run(scenario())


def test_a_direct_connection_to_the_inner_port_is_unauthenticated(ids: Ids) -> None:
    """Another local process that dials the plaintext inner port has no identity."""
    sec = ids.sec

    async def scenario() -> None:
        port = free_port()
        server = await start_admin(_swim(), lambda: 0.0, _plane(), sec, port)
        assert isinstance(server, FrontedServer)
        inner = server.front.inner
        assert inner[0] == "127.0.0.1" and inner[1] != port
        try:
            async with admin_channel(sec, port) as ch:  # a good client holds an entry
                await admin_pb2_grpc.AdminStub(ch).Whoami(admin_pb2.WhoamiRequest(), timeout=5)
                assert len(server.front.peers) == 1
                async with grpc.aio.insecure_channel(f"127.0.0.1:{inner[1]}") as direct:
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await admin_pb2_grpc.AdminStub(direct).Whoami(
                            admin_pb2.WhoamiRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, err.value
            assert "no client certificate" in (err.value.details() or "")
        finally:
            await server.stop(0)

    asyncio.run(scenario())


def test_a_slowloris_is_bounded_and_timed_out_and_good_clients_get_in(ids: Ids) -> None:
    sec = ids.sec
    hello = client_hello()

    async def scenario() -> None:
        port = free_port()
        server = await start_admin(_swim(), lambda: 0.0, _plane(), sec, port)
        assert isinstance(server, FrontedServer)
        front = server.front
        front.max_handshakes, front.handshake_timeout = 8, 1.5
        before = dict(sec.refusals)
        writers = []
        try:
            for i in range(40):  # half say nothing, half send a part of a ClientHello
                _, w = await asyncio.open_connection("127.0.0.1", port)
                if i % 2:
                    w.write(hello[:20])
                writers.append(w)
            await until(lambda: sec.refusals[("admin", "handshake_limit")]
                        - before.get(("admin", "handshake_limit"), 0) >= 32)
            assert len(front.pending) <= 8
            t0 = time.monotonic()
            async with admin_channel(sec, port) as ch:
                await admin_pb2_grpc.AdminStub(ch).Whoami(admin_pb2.WhoamiRequest(), timeout=5)
            assert time.monotonic() - t0 < 1.0  # not behind the slowloris's timeouts
            await until(lambda: not front.pending, timeout=5)

            def more(reason: str) -> int:
                return sec.refusals[("admin", reason)] - before.get(("admin", reason), 0)
            assert more("handshake_limit") + more("handshake_timeout") == 40
            assert more("handshake_timeout") >= 1
        finally:
            for w in writers:
                w.close()
            await server.stop(0)

    asyncio.run(scenario())


def test_meshctl_reads_the_fronts_alert(ids: Ids) -> None:
    """With the front, meshctl reads why from the alert (not from the issuers)."""
    sec = ids.sec

    async def scenario() -> dict[str, str | None]:
        port = free_port()
        server = await start_admin(_swim(), lambda: 0.0, _plane(), sec, port)
        target = f"127.0.0.1:{port}"
        loop = asyncio.get_running_loop()
        then = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=90)  # our clock says: valid
        try:
            return {
                "good": await loop.run_in_executor(None, explain, target, ids.good),
                "foreign": await loop.run_in_executor(None, explain, target, ids.foreign),
                "expired": await loop.run_in_executor(
                    None, lambda: explain(target, ids.expired, now=then)),
            }
        finally:
            await server.stop(0)

    got = asyncio.run(scenario())
    assert got["good"] is None
    assert got["foreign"] == (f"the server refused our certificate ({ids.foreign}): it is not "
                              "from a CA the server trusts (a certificate of another mesh?)")
    assert got["expired"] == (f"the server refused our certificate ({ids.expired}): it has "
                              "expired, by the server's clock")


# --- fuzz: anything as a ClientHello ----------------------------------------------------------


def client_hello() -> bytes:
    """The first flight of a real TLS client."""
    obj = ssl.create_default_context().wrap_bio(ssl.MemoryBIO(), out := ssl.MemoryBIO(),
                                                 server_hostname="x")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


class Loop:
    """An event loop in a thread, for tests whose examples are synchronous (hypothesis)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.errors: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda _, ctx: self.errors.append(ctx))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def echo_front(ids: Ids) -> Iterator[tuple[Loop, TlsFront, list[Refusal], int]]:
    """A front over an echo server (the inner side is not what is fuzzed)."""
    lp = Loop()
    got: list[Refusal] = []

    async def start() -> tuple[TlsFront, int, asyncio.Server]:
        async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
            w.close()
        inner = await asyncio.start_server(echo, "127.0.0.1", 0)
        front = TlsFront(server_context(lambda: tls.server_context(ids.sec.id_dir)),
                         ("127.0.0.1", inner.sockets[0].getsockname()[1]),
                         on_refused=got.append, handshake_timeout=2.0)
        return front, await front.start("127.0.0.1", 0), inner

    front, port, inner = lp.run(start())
    yield lp, front, got, port
    front.close()
    inner.close()
    lp.close()


def _mutations() -> st.SearchStrategy[bytes]:
    hello = client_hello()
    flips = st.lists(st.tuples(st.integers(0, len(hello) - 1), st.integers(0, 255)),
                     min_size=1, max_size=8)

    def mutate(changes: list[tuple[int, int]]) -> bytes:
        out = bytearray(hello)
        for i, b in changes:
            out[i] = b
        return bytes(out)

    return st.one_of(st.binary(min_size=1, max_size=2048),
                     st.binary(min_size=1, max_size=600).map(lambda b: b"\x16\x03\x01" + b),
                     flips.map(mutate),
                     st.integers(1, len(hello) - 1).map(lambda n: hello[:n]))


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(data=_mutations())
def test_random_bytes_as_a_client_hello_are_counted_once_and_never_crash_the_front(
        echo_front: tuple[Loop, TlsFront, list[Refusal], int], data: bytes) -> None:
    lp, front, got, port = echo_front
    before = len(got)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(data)
        raw.shutdown(socket.SHUT_WR)
        try:
            while raw.recv(4096):
                pass
        except OSError:
            pass
    deadline = time.monotonic() + 5
    while len(got) == before and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(got) == before + 1, got[before:]
    assert got[-1].reason in REASONS, got[-1]
    if data[0] != 0x16:
        assert got[-1].reason == "plaintext"
    assert not lp.errors, lp.errors
    assert not front.pending


def test_the_fuzzed_front_still_serves(echo_front: tuple[Loop, TlsFront, list[Refusal], int],
                                       ids: Ids) -> None:
    lp, front, got, port = echo_front
    ctx = tls.client_context(ids.good)
    inb, outb = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inb, outb)  # a half-close inside TLS needs the BIOs by hand
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        while True:
            try:
                obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                raw.sendall(outb.read())
                inb.write(raw.recv(65536))
        obj.write(b"x" * 300_000)
        with pytest.raises(ssl.SSLWantReadError):
            obj.unwrap()  # our close_notify: a half-close; the echo still comes back
        raw.sendall(outb.read())
        while data := raw.recv(65536):
            inb.write(data)
            try:
                while chunk := obj.read(65536):
                    received += chunk
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                pass
    assert received == b"x" * 300_000
    assert not lp.errors, lp.errors


# --- the router's HTTPS port ------------------------------------------------------------------


def test_router_https_port_counts_and_audits_every_refused_handshake(ids: Ids,
                                                                     tmp_path: Path) -> None:
    lp = Loop()
    gw = Gateway(LocalScoring(Scorer(FusedState("a")), lp.loop.time), lp.loop.time)
    log = tmp_path / "audit.log"
    audit = AuditLog(log)
    server_ctx = tls.server_context(ids.sec.id_dir, require_client_cert=False)
    runner, addr = lp.run(router_server.serve_http(
        gw, ("127.0.0.1", 0), ssl_context=server_ctx, auth=ClientAuth(dev=False), audit=audit))
    site = next(iter(runner.sites))
    assert isinstance(site, CountedTlsSite)
    site.handshake_timeout = 0.5
    port = int(addr.rsplit(":", 1)[1])
    counted = gw.counters.refused

    def refused(reason: str, ctx: ssl.SSLContext | None, payload: bytes = b"GET / HTTP/1.1\r\n"
                b"Host: a\r\n\r\n") -> None:
        before = counted.get(f"router_http:{reason}", 0)
        assert attempt(port, ctx, payload) != "open"
        deadline = time.monotonic() + 5
        while counted.get(f"router_http:{reason}", 0) == before:
            assert time.monotonic() < deadline, (reason, counted)
            time.sleep(0.02)
        # Counted, then audited: the record may land just after the count.
        while not (records := [r for r in audited(log, "router_http")
                               if r["reason"] == reason][before:]):
            assert time.monotonic() < deadline, (reason, audited(log, "router_http"))
            time.sleep(0.02)
        assert records[-1]["peer"].startswith("ipv4:127.0.0.1:"), records

    def get(ctx: ssl.SSLContext) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"https://{addr}/v2/health/live", timeout=5,
                                        context=ctx) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    try:
        # A router call with a mesh certificate; none: 401, as before (not a handshake error).
        assert get(tls.client_context(ids.good))[0] == 200
        assert get(tls.client_context(None, bundle_pem=ids.bundle))[0] == 401
        refused("unknown_ca", tls.client_context(ids.foreign))
        refused("certificate_expired", tls.client_context(ids.expired))
        refused("certificate_not_yet_valid", tls.client_context(ids.early))
        refused("client_refused_our_certificate", tls.client_context(ids.elsewhere))
        refused("plaintext", None)
        refused("plaintext", None, H2_PREFACE)
        refused("other", None, NOT_A_HELLO)
        refused("handshake_timeout", None, b"")
        # Many stalled handshakes are bounded; a good client still gets in.
        site.max_handshakes = 4
        stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(12)]
        try:
            deadline = time.monotonic() + 5
            while counted.get("router_http:handshake_limit", 0) < 8:
                assert time.monotonic() < deadline, counted
                time.sleep(0.02)
            assert len(site.pending) <= 4
            assert get(tls.client_context(ids.good))[0] == 200
        finally:
            for s in stalled:
                s.close()
        assert not lp.errors, lp.errors
    finally:
        lp.run(runner.cleanup())
        lp.run(gw.close())
        lp.close()
        audit.close()
    # The agent's metrics show the router's refusals with its own.
    collector = RoutingCollector("a", Scorer(FusedState("a")),
                                 router=lambda: {"w1": gw.counters, "w2": RouterCounters(
                                     refused={"router_http:unknown_ca": 2})})
    assert collector.refusals()[("router_http", "unknown_ca")] == counted[
        "router_http:unknown_ca"] + 2


# --- the router's gRPC port, fronted ----------------------------------------------------------


def test_router_grpc_port_behind_the_front(ids: Ids, tmp_path: Path) -> None:
    sec: Security = ids.sec
    log = tmp_path / "audit.log"

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        audit = AuditLog(log)
        ctx = router_server.front_context(sec.id_dir, tokens=False)
        server, gw, where = await router_server.serve(
            LocalScoring(Scorer(FusedState("a")), loop.time), loop.time, ("127.0.0.1", 0),
            dev=False, identity=lambda: sec.identity, verifier=sec.verifier,
            tls_front=ctx, audit=audit)
        assert isinstance(server, FrontedServer)
        port = int(where.rsplit(":", 1)[1])
        live = "/inference.GRPCInferenceService/ServerLive"
        try:
            async with tls.grpc_channel(where, sec.identity, aio=True) as ch:  # type: ignore[attr-defined]
                call = ch.unary_unary(live, service_pb2.ServerLiveRequest.SerializeToString,
                                      service_pb2.ServerLiveResponse.FromString)
                assert (await call(service_pb2.ServerLiveRequest(), timeout=5)).live
            refused = await loop.run_in_executor(None, attempt, port,
                                                 ids.context(ids.foreign))
            assert refused == "TLSV1_ALERT_UNKNOWN_CA"
            await until(lambda: gw.counters.refused.get("router:unknown_ca") == 1)
            assert audited(log, "router")[-1]["reason"] == "unknown_ca"
            inner = f"127.0.0.1:{server.front.inner[1]}"
            async with grpc.aio.insecure_channel(inner) as ch:
                call = ch.unary_unary(live, service_pb2.ServerLiveRequest.SerializeToString,
                                      service_pb2.ServerLiveResponse.FromString)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call(service_pb2.ServerLiveRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        finally:
            await server.stop(0)
            await gw.close()
            audit.close()

    asyncio.run(scenario())
