"""pysyncobj over the mesh's mutual TLS (consensus.transport).

The cluster test runs three real SyncObj nodes in three processes (tests/raft_node.py).  The
attack tests run one SyncObj node in this process, so they can watch what reaches its Raft layer:
a spy wraps the message callback SyncObj gave the transport, and every attack asserts that it
saw nothing, next to a control in which a real member does get a message through.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pickle
import queue
import random
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
from cryptography.hazmat.primitives import serialization
from pysyncobj import SyncObj, SyncObjConf

from certs import tls
from certs.ca import CertificateAuthority
from certs.spiffe import SpiffeId
from certs.verify import PeerVerifier
from consensus.transport import (
    ACK,
    HELLO,
    RaftTls,
    TlsTransport,
    mesh_authorizer,
    tls_transport,
)
from meshd.dev.ports import free_ports

ROOT = Path(__file__).resolve().parent.parent
TD = "mesh.test"
N2 = "127.0.0.2:7000"
"""The member a test client plays: its address sorts above the node's, so it is the one to dial
(nobody ever connects to it)."""
MAX_FRAME = 64 * 1024
PROBE = {"type": "probe", "term": 0}
"""What the control member sends; SyncObj ignores unknown message types."""


# --- PKI ------------------------------------------------------------------------------------

@dataclass
class Pki:
    mesh: CertificateAuthority
    other: CertificateAuthority  # another trust domain whose root the test node's TLS trusts
    dirs: dict[str, Path]

    @property
    def mesh_pem(self) -> bytes:
        return self.mesh.root.public_bytes(serialization.Encoding.PEM)

    def client(self, who: str | None) -> ssl.SSLContext:
        """A client context for identity ``who`` (None: no certificate) trusting the mesh."""
        return tls.client_context(None if who is None else self.dirs[who],
                                  bundle_pem=self.mesh_pem)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    base = tmp_path_factory.mktemp("pki")
    mesh = CertificateAuthority.create(TD)
    rogue = CertificateAuthority.create(TD)  # same trust domain name, different key
    other = CertificateAuthority.create("other.test")
    past = time.time() - 7200
    made = {
        "n1": mesh.mint(SpiffeId.node(TD, "n1"), ["node"]),
        "n2": mesh.mint(SpiffeId.node(TD, "n2"), ["node"]),
        "n3": mesh.mint(SpiffeId.node(TD, "n3"), ["node"]),
        "expired": mesh.mint(SpiffeId.node(TD, "n2"), ["node"],
                             lifetime=dt.timedelta(hours=1), now=past),
        "alice": mesh.mint(SpiffeId(TD, "user", "alice"), ["admin"]),
        "rogue": rogue.mint(SpiffeId.node(TD, "n2"), ["node"]),
        "other": other.mint(SpiffeId.node("other.test", "n2"), ["node"]),
    }
    dirs = {}
    for name, ident in made.items():
        ident.save(base / name)
        dirs[name] = base / name
    return Pki(mesh, other, dirs)


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def no_stray_threads() -> Iterator[None]:
    """Every SyncObj tick thread and pipe reader a test starts is gone when it ends."""
    before = set(threading.enumerate())
    yield
    wait_for(lambda: not (set(threading.enumerate()) - before), 5.0,
             "the test's threads to end")


# --- one node in this process ---------------------------------------------------------------

@dataclass
class LocalNode:
    obj: SyncObj
    transport: TlsTransport
    port: int
    verifier: PeerVerifier
    received: list[Any]  # what reached SyncObj's message callback
    refusals: list[str]  # what on_refused was told

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"


def _start_node(pki: Pki, addr: str, others: list[str], names: dict[str, str],
                ) -> tuple[SyncObj, TlsTransport, PeerVerifier, list[str], list[Any]]:
    verifier = PeerVerifier((*pki.mesh.bundle, *pki.other.bundle), TD)
    server_ctx = tls.server_context(pki.dirs["n1"])
    # a federated root: TLS accepts other.test, so only our trust-domain check can refuse it
    server_ctx.load_verify_locations(
        cadata=pki.other.root.public_bytes(serialization.Encoding.PEM).decode())
    refusals: list[str] = []
    settings = RaftTls(server_ctx, tls.client_context(pki.dirs["n1"]), mesh_authorizer(verifier),
                       on_refused=refusals.append, node_names=names, max_frame=MAX_FRAME)
    cls = tls_transport(settings)
    conf = SyncObjConf(appendEntriesUseBatch=False, bindAddress=addr, connectionTimeout=1.5,
                       connectionRetryTime=0.3)
    obj = SyncObj(addr, others, conf, transportClass=cls)
    (transport,) = cls.instances
    received: list[Any] = []
    deliver = transport._onMessageReceivedCallback

    def spy(node: Any, message: Any) -> None:
        received.append(message)
        deliver(node, message)

    transport.setOnMessageReceivedCallback(spy)
    return obj, transport, verifier, refusals, received


@pytest.fixture
def local(pki: Pki) -> Iterator[LocalNode]:
    (port,) = free_ports(1)
    addr = f"127.0.0.1:{port}"
    obj, transport, verifier, refusals, received = _start_node(
        pki, addr, [N2], {addr: "n1", N2: "n2"})
    try:
        obj.waitBinded()
        yield LocalNode(obj, transport, port, verifier, received, refusals)
    finally:
        obj.destroy_synchronous()
    with socket.socket() as s:  # destroy closed the listening socket (TIME_WAIT is fine)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def read_until_closed(sock: socket.socket, timeout: float = 3.0) -> tuple[bool, bytes]:
    """(whether the peer closed the connection within ``timeout``, what it sent before)."""
    sock.settimeout(timeout)
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return False, data
        except (ssl.SSLError, ConnectionError, OSError):
            return True, data
        if not chunk:
            return True, data
        data += chunk
    return False, data


def tls_client(port: int, ctx: ssl.SSLContext) -> ssl.SSLSocket | None:
    """A TLS connection to the node, or None when the handshake itself was refused."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=3)
    try:
        return ctx.wrap_socket(raw)
    except (ssl.SSLError, ConnectionError):
        raw.close()
        return None


def member_session(node: LocalNode, ctx: ssl.SSLContext, address: str = N2) -> ssl.SSLSocket:
    """Handshake, hello and ack, as a member dialling the node."""
    sock = tls_client(node.port, ctx)
    assert sock is not None, "a member's TLS handshake failed"
    sock.sendall(frame(HELLO + address.encode()))
    sock.settimeout(3)
    got = b""
    while len(got) < 4 + len(ACK):
        chunk = sock.recv(64)
        assert chunk, f"the node closed the member's connection (refused: {node.refusals})"
        got += chunk
    assert got[:4 + len(ACK)] == frame(ACK)
    return sock


def assert_control_delivers(node: LocalNode, pki: Pki) -> None:
    """A real member gets a message through, so "nothing delivered" elsewhere means something."""
    before = node.transport.delivered_messages
    with member_session(node, pki.client("n2")) as sock:
        sock.sendall(frame(pickle.dumps(PROBE)))
        wait_for(lambda: PROBE in node.received, 5, "the member's message to reach SyncObj")
    assert node.transport.delivered_messages == before + 1
    assert node.obj.tick_thread_alive()


# --- 1: a real cluster ----------------------------------------------------------------------

class RaftProc:
    """A tests/raft_node.py child: one JSON command/answer per line."""

    def __init__(self, name: str, addr: str, peers: list[str], names: dict[str, str],
                 identity: Path, log: Path) -> None:
        self.name, self.addr = name, addr
        cmd = [sys.executable, "-m", "tests.raft_node", "--identity", str(identity),
               "--self", addr]
        for p in peers:
            cmd += ["--peer", p]
        for a, n in names.items():
            cmd += ["--name", f"{a}={n}"]
        self.log_path = log
        self._log: IO[str] = log.open("w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def next_line(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.name}: no answer in {timeout}s; log:\n"
                                 f"{self.log_tail()}") from None
        if line is None:
            raise AssertionError(f"{self.name} exited; log:\n{self.log_tail()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, cmd: str, timeout: float = 10.0) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.next_line(timeout)

    def log_tail(self) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text().splitlines()[-30:])

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(5)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()  # the node exits at end of input
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)
        elif self.proc.stdin is not None:
            self.proc.stdin.close()
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


@pytest.fixture
def cluster(pki: Pki, tmp_path: Path) -> Iterator[list[RaftProc]]:
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    names = {a: f"n{i + 1}" for i, a in enumerate(addrs)}
    procs: list[RaftProc] = []
    try:
        for addr, name in names.items():
            peers = [a for a in addrs if a != addr]
            procs.append(RaftProc(name, addr, peers, names, pki.dirs[name],
                                  tmp_path / f"{name}.log"))
        yield procs
    finally:
        for p in procs:
            p.close()


def agreed_leader(procs: list[RaftProc], connected: int) -> str | None:
    """The leader every node names, once each has ``connected`` peers; else None."""
    statuses = [p.ask("status") for p in procs]
    leaders = {s["leader"] for s in statuses}
    alive = {p.addr for p in procs}
    if len(leaders) == 1 and all(len(s["connected"]) == connected for s in statuses):
        (leader,) = leaders
        return leader if leader in alive else None
    return None


def test_three_processes_replicate_and_elect_after_leader_dies(cluster: list[RaftProc]) -> None:
    for p in cluster:
        assert p.next_line(20)["ready"]
    leader = wait_for(lambda: agreed_leader(cluster, 2), 15, "a leader all three agree on")
    first = next(p for p in cluster if p.addr == leader)
    follower = next(p for p in cluster if p.addr != leader)

    assert follower.ask("inc") == {"value": 1}  # forwarded to the leader, committed
    assert first.ask("inc") == {"value": 2}
    wait_for(lambda: all(p.ask("status")["counter"] == 2 for p in cluster), 10,
             "the counter to be 2 on every node")
    for status in (p.ask("status") for p in cluster):
        assert status["delivered"] > 0
        assert status["refused"] == {} and status["on_refused"] == [], status

    first.kill()
    survivors = [p for p in cluster if p is not first]
    new_leader = wait_for(lambda: agreed_leader(survivors, 1), 15,
                          "the two survivors to elect a new leader")
    assert new_leader != leader
    assert survivors[0].ask("inc") == {"value": 3}
    wait_for(lambda: all(p.ask("status")["counter"] == 3 for p in survivors), 10,
             "the counter to be 3 on both survivors")


# --- 2: plain TCP ---------------------------------------------------------------------------

class _Evil:
    """Unpickling this creates a directory: proof of code execution if it ever happens."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def test_plain_tcp_reaches_nothing(local: LocalNode, pki: Pki, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    vote = pickle.dumps({"type": "request_vote", "term": 99, "last_log_index": 99,
                         "last_log_term": 99}, 2)
    add = zlib.compress(pickle.dumps(["add", "127.0.0.9:1"], 2), 3)  # syncobj_admin's command
    attacks = {
        "pysyncobj frame": struct.pack("i", len(add)) + add,  # pysyncobj's own wire format
        "pickled vote": frame(vote),
        "code execution": frame(pickle.dumps(_Evil(marker))),
        "random bytes": random.Random(7).randbytes(4096),
    }
    for i, (what, data) in enumerate(attacks.items(), 1):
        with socket.create_connection(("127.0.0.1", local.port), timeout=3) as sock:
            sock.sendall(data)
            closed, _ = read_until_closed(sock)
            assert closed, f"{what}: the node kept the connection open"

        def refused(n: int = i) -> bool:
            return local.transport.refused["tls_handshake"] == n

        wait_for(refused, 3, f"{what} to be refused")
    # a client that sends nothing is dropped once the handshake deadline passes
    with socket.create_connection(("127.0.0.1", local.port), timeout=3) as sock:
        closed, data = read_until_closed(sock, timeout=4)
        assert closed and data == b""
    assert local.refusals == ["tls_handshake"] * len(attacks) + ["handshake_timeout"]
    assert local.received == [] and local.transport.delivered_messages == 0
    assert local.transport.delivered_bytes == 0
    assert not marker.exists()
    assert_control_delivers(local, pki)


# --- 3: refused identities ------------------------------------------------------------------

@pytest.mark.parametrize(("client", "hello", "reason"), [
    (None, N2, "no_certificate"),
    ("rogue", N2, "untrusted"),  # another CA, same trust domain name
    ("expired", N2, "expired"),
    ("n2", N2, "revoked"),  # n2's own, valid certificate, revoked below
    ("other", N2, "wrong_trust_domain"),  # TLS accepts its root; our check must not
    ("alice", N2, "not_a_node"),  # a person's certificate
    ("n3", N2, "wrong_node"),  # a member claiming another member's address
    ("n2", "127.0.0.3:1", "unknown_node"),
], ids=["no_cert", "other_ca", "expired", "revoked", "wrong_trust_domain", "person",
        "impersonation", "unknown_member"])
def test_refused_identities(local: LocalNode, pki: Pki, client: str | None, hello: str,
                            reason: str) -> None:
    if reason == "revoked":
        local.verifier.revocations.revoke(SpiffeId.node(TD, "n2"), time.time())
    sock = tls_client(local.port, pki.client(client))
    if sock is not None:  # TLS 1.3: the client finishes first, the server refuses after
        with sock:
            try:
                sock.sendall(frame(HELLO + hello.encode()) + frame(pickle.dumps(PROBE)))
            except (ssl.SSLError, ConnectionError):
                pass
            closed, data = read_until_closed(sock)
            assert closed, "the node kept a refused connection open"
            assert ACK not in data
    wait_for(lambda: local.refusals, 3, "the refusal to be reported")
    assert local.refusals == [reason]
    assert local.transport.refused == {reason: 1}
    assert local.received == [] and local.transport.delivered_messages == 0
    assert local.transport.connected_nodes == frozenset()
    if reason != "revoked":
        assert_control_delivers(local, pki)


# --- 4: frames from an authenticated member -------------------------------------------------

def test_oversized_frame_drops_the_member(local: LocalNode, pki: Pki) -> None:
    with member_session(local, pki.client("n2")) as sock:
        wait_for(lambda: local.transport.connected_nodes, 3, "the member to be connected")
        sock.sendall(struct.pack(">I", MAX_FRAME + 1) + b"x" * 1024)
        closed, _ = read_until_closed(sock)
        assert closed
    wait_for(lambda: not local.transport.connected_nodes, 3, "the member to be disconnected")
    assert local.refusals == ["frame_too_large"]
    assert local.received == []
    with member_session(local, pki.client("n2")) as sock:  # a huge length, no payload at all
        sock.sendall(struct.pack(">I", 0xFFFFFFFF))
        assert read_until_closed(sock)[0]
    assert local.refusals == ["frame_too_large"] * 2
    assert local.received == []
    assert_control_delivers(local, pki)  # the node lives on


def test_member_cannot_send_code_either(local: LocalNode, pki: Pki, tmp_path: Path) -> None:
    """Frames are decoded as plain data only: a global in a pickle drops the member."""
    marker = tmp_path / "pwned"
    with member_session(local, pki.client("n2")) as sock:
        sock.sendall(frame(pickle.dumps(_Evil(marker))))
        assert read_until_closed(sock)[0]
    assert local.refusals == ["bad_frame"]
    assert local.received == [] and not marker.exists()
    assert_control_delivers(local, pki)


def test_reconnecting_member_replaces_its_old_connection(local: LocalNode, pki: Pki) -> None:
    first = member_session(local, pki.client("n2"))
    with first:
        wait_for(lambda: local.transport.connected_nodes, 3, "the member to be connected")
        with member_session(local, pki.client("n2")) as second:
            assert read_until_closed(first)[0], "the old connection was kept"
            second.sendall(frame(pickle.dumps(PROBE)))
            wait_for(lambda: PROBE in local.received, 3, "the message on the new connection")
            assert {n.address for n in local.transport.connected_nodes} == {N2}
    assert local.refusals == []


# --- outgoing connections check the server too ----------------------------------------------

class FakeMember:
    """A TLS server posing as a member; records what reaches it after each handshake."""

    def __init__(self, port: int, identity: Path, pki: Pki) -> None:
        self.ctx = tls.server_context(identity)
        self.ctx.load_verify_locations(cadata=pki.mesh_pem.decode())
        self.sock = socket.create_server(("127.0.0.1", port))
        self.sock.settimeout(0.1)
        self.handshakes = 0
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                raw, _ = self.sock.accept()
            except TimeoutError:
                continue
            raw.settimeout(3)
            try:
                conn = self.ctx.wrap_socket(raw, server_side=True)
            except (ssl.SSLError, OSError):
                raw.close()
                continue
            self.handshakes += 1
            with conn:
                self.received.append(read_until_closed(conn)[1])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.mark.parametrize(("identity", "reason"), [("n3", "wrong_node"), ("rogue", "untrusted")])
def test_outgoing_connection_checks_the_server(pki: Pki, identity: str, reason: str) -> None:
    low, high = sorted(f"127.0.0.1:{p}" for p in free_ports(2))  # the higher address dials
    fake = FakeMember(int(low.rsplit(":", 1)[1]), pki.dirs[identity], pki)
    obj, transport, _, refusals, received = _start_node(pki, high, [low],
                                                        {high: "n1", low: "n2"})
    try:
        wait_for(lambda: transport.refused[reason] >= 1, 5, f"the node to refuse: {reason}")
        assert transport.connected_nodes == frozenset() and received == []
    finally:
        obj.destroy_synchronous()
        fake.close()
    assert set(refusals) == {reason}
    if reason == "wrong_node":
        assert fake.handshakes >= 1  # TLS worked; our check refused the name
    assert all(data == b"" for data in fake.received), "the node sent bytes to a refused server"


# --- a restart is not an attack: what is deferred, and what is still refused ----------------

@pytest.fixture
def restarted(pki: Pki) -> Iterator[tuple[LocalNode, dict[str, str]]]:
    """A node as a coordinator restarted from its saved configuration finds itself: Raft runs,
    but gossip has not yet named the member at N2 (its ``node_names`` has only itself)."""
    (port,) = free_ports(1)
    addr = f"127.0.0.1:{port}"
    names = {addr: "n1"}
    obj, transport, verifier, refusals, received = _start_node(pki, addr, [N2], names)
    try:
        obj.waitBinded()
        yield LocalNode(obj, transport, port, verifier, received, refusals), names
    finally:
        obj.destroy_synchronous()


def test_a_member_gossip_has_not_named_yet_is_deferred_not_refused(
        restarted: tuple[LocalNode, dict[str, str]], pki: Pki) -> None:
    """Right after a restart the member at N2 dials in before gossip says who N2 is: the
    connection is closed and counted as ``unknown_address`` (no security refusal, nothing
    delivered).  Once gossip names N2 the member gets in, and another node's certificate at
    that address is refused as ``wrong_node``, as always."""
    local, names = restarted
    sock = tls_client(local.port, pki.client("n2"))
    assert sock is not None
    with sock:
        sock.sendall(frame(HELLO + N2.encode()) + frame(pickle.dumps(PROBE)))
        closed, data = read_until_closed(sock)
        assert closed and ACK not in data
    wait_for(lambda: local.transport.deferred, 3, "the deferral to be counted")
    assert local.transport.deferred == {"unknown_address": 1}
    assert local.refusals == [] and local.transport.refused == {}
    assert local.received == [] and local.transport.connected_nodes == frozenset()

    names[N2] = "n2"  # gossip caught up
    assert_control_delivers(local, pki)
    sock = tls_client(local.port, pki.client("n3"))  # n3 claims n2's address
    assert sock is not None
    with sock:
        sock.sendall(frame(HELLO + N2.encode()))
        assert read_until_closed(sock)[0]
    wait_for(lambda: local.refusals, 3, "the refusal to be reported")
    assert local.refusals == ["wrong_node"] and local.transport.refused == {"wrong_node": 1}
    assert local.transport.deferred == {"unknown_address": 1}


def test_dialling_a_member_gossip_has_not_named_yet_waits_for_its_name(pki: Pki) -> None:
    """Our own dial to a member address gossip has not named yet: closed after the handshake,
    before our hello, as a deferral (not ``wrong_node``); redialled once it is named."""
    low, high = sorted(f"127.0.0.1:{p}" for p in free_ports(2))  # the higher address dials
    fake = FakeMember(int(low.rsplit(":", 1)[1]), pki.dirs["n2"], pki)
    names = {high: "n1"}
    obj, transport, _, refusals, received = _start_node(pki, high, [low], names)
    try:
        wait_for(lambda: transport.deferred["unknown_address"] >= 1, 5, "a deferral")
        assert refusals == [] and transport.refused == {}
        assert all(HELLO not in data for data in fake.received)
        names[low] = "n2"
        wait_for(lambda: any(HELLO in data for data in fake.received), 10,
                 "the node's hello once gossip named the member")
        assert refusals == [] and received == []
    finally:
        obj.destroy_synchronous()
        fake.close()


class HangUp:
    """A member going down: it accepts connections and closes them before any TLS."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_server(("127.0.0.1", port))
        self.sock.settimeout(0.1)
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                raw, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            raw.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def test_a_member_hanging_up_mid_handshake_is_no_refusal(pki: Pki) -> None:
    """A peer that dies (or restarts) while we dial it ends our handshake with end of stream:
    ``peer_closed``, counted apart, not a ``tls_handshake`` refusal.  (A client that does the
    same to our listening port is still one: that is how scanners look.)"""
    low, high = sorted(f"127.0.0.1:{p}" for p in free_ports(2))
    dying = HangUp(int(low.rsplit(":", 1)[1]))
    obj, transport, _, refusals, _ = _start_node(pki, high, [low], {high: "n1", low: "n2"})
    try:
        wait_for(lambda: transport.deferred["peer_closed"] >= 1, 5, "a hang-up to be counted")
        assert refusals == [] and transport.refused == {}
        assert set(transport.deferred) == {"peer_closed"}
    finally:
        obj.destroy_synchronous()
        dying.close()


# --- API edges ------------------------------------------------------------------------------

def test_unbound_class_and_readonly_nodes_are_refused(pki: Pki) -> None:
    conf = SyncObjConf(appendEntriesUseBatch=False)
    with pytest.raises(TypeError, match="tls_transport"):
        SyncObj("127.0.0.1:1", [N2], conf, transportClass=TlsTransport)
    settings = RaftTls(tls.server_context(pki.dirs["n1"]), tls.client_context(pki.dirs["n1"]),
                       lambda der: "n1")
    with pytest.raises(ValueError, match="read-only"):
        SyncObj(None, [N2], conf, transportClass=tls_transport(settings))
