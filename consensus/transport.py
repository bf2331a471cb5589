"""A pysyncobj ``Transport`` that carries Raft messages over mutual TLS with mesh certificates.

Why: pysyncobj's wire format is pickle and its port accepts membership commands, so whoever can
send it bytes can run code and change the cluster.  With this transport a connection delivers
nothing to the Raft layer until (1) OpenSSL verified the peer's chain against the mesh roots,
(2) our own ``authorize`` accepted the peer's leaf certificate (trust domain, revocation, role),
and (3) the peer named a cluster member it is allowed to be.  Only then are frames decoded.

Design (why not wrap pysyncobj's ``TcpConnection``): its sockets are non-blocking and driven by
SyncObj's poller, and wrapping them with ``ssl.SSLSocket`` brings ``SSLWantRead``/``SSLWantWrite``
in both directions plus name-mangled internals we would have to override.  Instead every
connection is a plain non-blocking socket plus an ``ssl.SSLObject`` over two ``MemoryBIO``s:
we move ciphertext between socket and BIOs ourselves, so the TLS engine never touches the socket
and only ever asks for more input.  The sockets are registered on ``syncObj._poller``, the same
poller SyncObj's tick thread polls, so all I/O, handshakes and every callback into SyncObj
(message received, node connected/disconnected) run on SyncObj's own thread: no extra thread,
no queue, no lock, and no thread-safety questions about pysyncobj's callbacks.

Wire format, inside TLS: frames of a 4-byte big-endian length and a payload.  The dialling side
sends ``HELLO + its Raft address`` and the accepting side answers ``ACK`` once it accepted that
address for the certificate it saw; only then is the node "connected" on either side and the
following frames are pickled pysyncobj messages, limited to ``RaftTls.max_frame`` bytes.  Those
are decoded with an unpickler that refuses every class and function: pysyncobj's messages are
plain data.  (This is no sandbox: pysyncobj unpickles log entries itself, so a Raft member with a
valid certificate is trusted; the certificate check is the security boundary.)

As in pysyncobj, of two nodes the one with the greater address string dials; a hello from a node
that we are supposed to dial is refused, and a new connection from a node replaces its old one
(it has probably restarted).  Read-only nodes and pysyncobj's utility messages (``syncobj_admin``)
are not supported: every Raft peer is a full member with a node certificate.  pysyncobj's
``TcpConnection`` drops a connection that read nothing for ``connectionTimeout`` when it next
sends, which hits the idle link between two followers just when they need it for an election;
here an established connection is never dropped for being idle: dead peers are found by TCP
keepalive (``conf.tcp_keepalive``) and end-of-stream, and only unfinished handshakes time out
(after ``conf.connectionTimeout``).  Memory per connection is bounded: frames by ``max_frame``,
unsent log replication by :data:`SEND_BACKLOG`.

Not every closed connection is a security event.  Two happen on every coordinator restart and
are counted apart (``deferred``, ``on_deferred``), not as refusals: a restarted node starts its
Raft groups from the saved configuration before gossip has told it which node is at each
member address, so until then a peer's address has no pinned name (``unknown_address``: closed
and tried again once gossip names it; a certificate of *another* node at a pinned address is
still ``wrong_node``); and a peer that dies or restarts hangs up in the middle of our handshake
(``peer_closed``: a connection we dialled that ended before TLS did, which a refusing peer
answers with an alert or after the handshake instead).
"""

from __future__ import annotations

import errno
import io
import logging
import pickle
import socket
import ssl
import struct
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.node import TCPNode
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import set_keepalive
from pysyncobj.transport import Transport, TransportNotReadyError

from certs.verify import PeerRejected, PeerVerifier

log = logging.getLogger("meshd.raft")

DEFAULT_MAX_FRAME = 16 * 1024 * 1024
"""pysyncobj sends at most ``appendEntriesBatchSizeBytes`` (64 KiB) of entries per message and
splits bigger entries, so real frames are far below this."""
MAX_HELLO = 1024
MAX_UNAUTHENTICATED = 64
"""Connections still in the TLS handshake or hello; more are refused at accept."""
SEND_BACKLOG = 4 * 1024 * 1024
"""Unsent bytes per connection above which ``send`` drops ``append_entries`` (returns False).
pysyncobj moves a follower's next index back to the last acknowledged entry on every ack and
resends from there, so whatever sits in a buffer gets sent again and again (an unbounded buffer
turned 28 MB of entries into ~3 GB of traffic in a flood test).  A dropped ``append_entries`` is
message loss Raft recovers from (the follower asks for its position); other messages (votes,
acks, forwarded client commands) are small and never dropped."""
RECV_CHUNK = 64 * 1024
RECV_ROUNDS = 16
"""recv() calls per poll event once authenticated (the poller is level-triggered)."""
ACCEPTS_PER_EVENT = 32
LOG_EVERY = 10.0
"""Seconds between warnings for the same refusal reason (or peer); the rest go to debug."""

PROTOCOL = b"meshd-raft/1"
HELLO = PROTOCOL + b" hello "
ACK = PROTOCOL + b" ok"
_LEN = struct.Struct(">I")
_READ, _WRITE, _ERROR = POLL_EVENT_TYPE.READ, POLL_EVENT_TYPE.WRITE, POLL_EVENT_TYPE.ERROR
_IN_PROGRESS = (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN, errno.EALREADY)


@dataclass(frozen=True)
class RaftTls:
    """How Raft connections are secured; bind it with :func:`tls_transport`.

    ``authorize`` gets the peer's leaf certificate (DER, None without one) after OpenSSL checked
    its chain and returns the peer's name, or raises to refuse it (a ``reason`` attribute, as
    on :class:`certs.verify.PeerRejected`, becomes the refusal label).  ``on_refused`` is told
    the short label of every connection we close for security reasons (metrics).
    ``node_names`` (Raft address -> certificate name) pins who may be which member; without it
    any authorized peer may claim any member address.  Both callables run on SyncObj's tick
    thread, so they must be quick (``PeerVerifier`` caches verified leaves).
    """

    server_context: ssl.SSLContext
    client_context: ssl.SSLContext
    authorize: Callable[[bytes | None], str]
    on_refused: Callable[[str], None] | None = None
    node_names: Mapping[str, str] | None = None
    max_frame: int = DEFAULT_MAX_FRAME
    before_send: Callable[[], None] | None = None
    """Runs before every message goes out: Raft's "persist before you answer" hook (see
    :mod:`consensus.durability`), so nothing we say can depend on state a power cut loses."""
    on_deferred: Callable[[str], None] | None = None
    """Told the label of every connection closed for a reason that is no security event
    (:data:`DEFERRED_REASONS`): it is tried again, and counted apart from refusals."""


DEFERRED_REASONS = ("unknown_address", "peer_closed")
"""Why a connection was closed without a security refusal: the peer's address has no pinned
name yet (gossip has not named it since we started), or a peer we dialled hung up before the
TLS handshake was over (it is going down or restarting)."""


def mesh_authorizer(verifier: PeerVerifier, role: str | None = "node"
                    ) -> Callable[[bytes | None], str]:
    """``authorize`` for mesh nodes: a verified certificate of a *node* identity (not a person)
    holding ``role``; raises :class:`PeerRejected` otherwise."""

    def authorize(leaf_der: bytes | None) -> str:
        peer = verifier.verify_der(leaf_der)
        if peer.spiffe_id.kind != "node":
            raise PeerRejected("not_a_node", f"{peer.spiffe_id} is not a node identity")
        if role is not None and role not in peer.roles:
            raise PeerRejected("missing_role", f"{peer.spiffe_id} lacks the {role!r} role")
        return peer.name

    return authorize


def tls_transport(settings: RaftTls) -> type[TlsTransport]:
    """A :class:`TlsTransport` subclass bound to ``settings``, for
    ``SyncObj(..., transportClass=tls_transport(settings))`` (SyncObj instantiates it itself)."""
    bound = settings

    class BoundTlsTransport(TlsTransport):
        settings = bound
        instances = weakref.WeakSet()

    return BoundTlsTransport


class _State(Enum):
    CONNECTING = "connecting"  # outgoing TCP connect in progress
    TLS = "tls"  # TLS handshake
    HELLO = "hello"  # authorized; waiting for the peer's hello (server) or ack (client)
    OPEN = "open"  # Raft messages flow
    CLOSED = "closed"


_VERIFY_REASONS = {10: "expired", 9: "not_yet_valid"}  # OpenSSL X509_V_ERR_* codes


def _tls_reason(exc: ssl.SSLError) -> str:
    """A refusal label for a failed handshake, in :data:`certs.verify.REJECT_REASONS` terms
    where OpenSSL says why (``tls_handshake`` for the rest: not TLS, protocol errors, ...)."""
    if exc.reason in ("PEER_DID_NOT_RETURN_A_CERTIFICATE", "TLSV13_ALERT_CERTIFICATE_REQUIRED"):
        return "no_certificate"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return _VERIFY_REASONS.get(exc.verify_code, "untrusted")
    return "tls_handshake"


def _droppable(message: Any) -> bool:
    """Log replication, the only bulk traffic: Raft resends it from the follower's position."""
    return isinstance(message, dict) and message.get("type") == "append_entries"


class _PlainDataUnpickler(pickle.Unpickler):
    """Refuses every global: Raft messages are dicts of numbers, strings and bytes."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"raft message refers to {module}.{name}")


class _Conn:
    """One TLS connection: a non-blocking socket, an SSLObject over memory BIOs, frame buffers."""

    def __init__(self, owner: TlsTransport, sock: socket.socket, *, outgoing: bool,
                 node: TCPNode | None, peer: str, deadline: float) -> None:
        self.owner = owner
        self.sock = sock
        self.fileno = sock.fileno()
        self.outgoing = outgoing
        self.node = node
        self.peer = peer  # address, for logs
        self.peer_name = ""
        self.state = _State.CONNECTING if outgoing else _State.TLS
        self.deadline = deadline
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        ctx = owner.tls.client_context if outgoing else owner.tls.server_context
        hostname = node.host if outgoing and node is not None and ctx.check_hostname else None
        self._tls = ctx.wrap_bio(self._in, self._out, server_side=not outgoing,
                                 server_hostname=hostname)
        self._rbuf = bytearray()
        self._wbuf = bytearray()
        self._want_write = outgoing  # a connecting socket becomes writable when connected
        self._subscribe()

    def __repr__(self) -> str:
        who = self.peer_name or "?"
        direction = "to" if self.outgoing else "from"
        return f"<raft conn {direction} {self.peer} ({who}) {self.state.value}>"

    # --- poller side ----------------------------------------------------------------------

    def _subscribe(self) -> None:
        mask = _READ | _ERROR | (_WRITE if self._want_write else 0)
        self.owner._poller.subscribe(self.fileno, self.on_event, mask)

    def on_event(self, descr: int, event: int) -> None:
        if self.state is _State.CLOSED or descr != self.fileno:
            return  # a stale event for a closed socket
        try:
            self._handle(event)
        except Exception:  # noqa: BLE001 - one broken connection must not stop the Raft tick
            log.exception("raft: %r failed", self)
            self.close()

    def _handle(self, event: int) -> None:
        if self.state is _State.CONNECTING:
            if self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                log.debug("raft: cannot connect to %s", self.peer)
                self.close()
                return
            try:
                self.sock.getpeername()
            except OSError:
                return  # not connected yet (spurious event)
            self.state = _State.TLS
            self._progress()
            self.flush()
            return
        eof = self._recv() if event & (_READ | _ERROR) else False
        if self.state is not _State.CLOSED:
            self._progress()
        if self.state is not _State.CLOSED:
            self.flush()
        if eof and self.state is not _State.CLOSED:
            log.debug("raft: %r: end of stream", self)
            self.close()

    def _recv(self) -> bool:
        """Move what the socket has into the TLS engine; True at end of stream.  Before the peer
        is authenticated one chunk per event, so it cannot make us buffer much."""
        rounds = RECV_ROUNDS if self.state in (_State.HELLO, _State.OPEN) else 1
        for _ in range(rounds):
            try:
                data = self.sock.recv(RECV_CHUNK)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                data = b""
            if not data:
                self._in.write_eof()
                return True
            self._in.write(data)
        return False

    def _progress(self) -> None:
        if self.state is _State.TLS:
            try:
                self._tls.do_handshake()
            except ssl.SSLWantReadError:
                return
            except ssl.SSLEOFError as exc:
                if self.outgoing:  # the peer went away mid-handshake: it is restarting or gone
                    self.refuse("peer_closed", f"the peer hung up during the TLS handshake "
                                f"({exc.reason or exc})", security=False)
                else:  # a scanner, or a client that did not like what it saw: ours to count
                    self.refuse("tls_handshake", f"TLS handshake failed ({exc.reason or exc})")
                return
            except ssl.SSLError as exc:
                self.refuse(_tls_reason(exc), f"TLS handshake failed ({exc.reason or exc})")
                return
            self.owner._authenticate(self)
        while self.state in (_State.HELLO, _State.OPEN):
            try:
                chunk = self._tls.read(RECV_CHUNK)
            except ssl.SSLWantReadError:
                return
            except ssl.SSLError as exc:
                if self.state is _State.HELLO and self.outgoing:
                    self.owner._warn(f"hello:{self.peer}", "raft: %s closed our connection "
                                     "during the hello (%s): does it accept our certificate?",
                                     self.peer, exc.reason or exc)
                elif not isinstance(exc, ssl.SSLZeroReturnError | ssl.SSLEOFError):
                    log.info("raft: %r: TLS error %s", self, exc.reason or exc)
                self.close()
                return
            if not chunk:
                return
            self._rbuf += chunk
            self._parse()

    def _parse(self) -> None:
        while self.state in (_State.HELLO, _State.OPEN) and len(self._rbuf) >= _LEN.size:
            (size,) = _LEN.unpack_from(self._rbuf)
            limit = self.owner.tls.max_frame if self.state is _State.OPEN else MAX_HELLO
            if size == 0 or size > limit:
                # refused on the header alone: nothing of an oversized frame is buffered
                self.refuse("frame_too_large" if size else "bad_frame",
                            f"frame of {size} bytes (limit {limit})")
                return
            if len(self._rbuf) < _LEN.size + size:
                return
            payload = bytes(self._rbuf[_LEN.size:_LEN.size + size])
            del self._rbuf[:_LEN.size + size]
            self.owner._frame(self, payload)

    # --- owner side -----------------------------------------------------------------------

    def peer_certificate(self) -> bytes | None:
        return self._tls.getpeercert(binary_form=True)

    @property
    def backlog(self) -> int:
        """Bytes accepted but not yet handed to the kernel."""
        return len(self._wbuf) + self._out.pending

    def send_frame(self, payload: bytes) -> None:
        self._tls.write(_LEN.pack(len(payload)) + payload)  # one TLS record where it fits
        self.flush()

    def flush(self) -> None:
        pending = self._out.read()
        if pending:
            self._wbuf += pending
        while self._wbuf:
            try:
                sent = self.sock.send(self._wbuf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                log.debug("raft: %r: send failed: %s", self, exc)
                self.close()
                return
            del self._wbuf[:sent]
        want = bool(self._wbuf)
        if want != self._want_write:
            self._want_write = want
            self._subscribe()

    def refuse(self, reason: str, detail: str, security: bool = True) -> None:
        """Close, counted as a security refusal, or (``security=False``) as a deferral: one
        of :data:`DEFERRED_REASONS`, tried again, nothing wrong seen."""
        if security:
            self.owner._count_refusal(self, reason, detail)
        else:
            self.owner._count_deferral(self, reason, detail)
        try:
            # best effort: a failed handshake leaves an alert saying why, useful to the peer
            pending = self._out.read()
            if pending and self.state is not _State.CLOSED:
                self.sock.send(pending)
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        if self.state is _State.CLOSED:
            return
        self.state = _State.CLOSED
        self.owner._poller.unsubscribe(self.fileno)
        try:
            self.sock.close()
        except OSError:
            pass
        self._rbuf.clear()
        self._wbuf.clear()
        self.owner._closed(self)


class TlsTransport(Transport):  # type: ignore[misc]
    """pysyncobj transport over mutual TLS; use :func:`tls_transport` to get a bound class.

    ``delivered_messages``/``delivered_bytes`` count what was handed to SyncObj and ``refused``
    counts refusals by label (both for metrics and tests); ``instances`` holds the live
    transports of a bound class.
    """

    settings: ClassVar[RaftTls | None] = None
    instances: ClassVar[weakref.WeakSet[TlsTransport]] = weakref.WeakSet()

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:  # noqa: N803
        super().__init__(syncObj, selfNode, otherNodes)
        settings = type(self).settings
        if settings is None:
            raise TypeError("TlsTransport needs its settings: pass "
                            "transportClass=tls_transport(RaftTls(...)) to SyncObj")
        if selfNode is None:
            raise ValueError("TlsTransport does not support read-only pysyncobj nodes: every "
                             "Raft peer is a member with a node certificate and an address")
        if not isinstance(selfNode, TCPNode):
            raise TypeError(f"TlsTransport needs TCPNode addresses, got {selfNode!r}")
        self.tls = settings
        self.delivered_messages = 0
        self.delivered_bytes = 0
        self.deferred: Counter[str] = Counter()
        """Connections closed for no security reason, by :data:`DEFERRED_REASONS` label."""
        self.last_heard: dict[str, float] = {}
        """Raft address -> ``time.monotonic()`` of the last message from it (quorum checks)."""
        self.dropped_messages = 0
        self.refused: Counter[str] = Counter()
        self._syncobj = syncObj
        self._conf = syncObj.conf
        self._poller = syncObj._poller
        self._self: TCPNode = selfNode
        self._nodes: set[TCPNode] = set()
        self._by_address: dict[str, TCPNode] = {}
        self._conns: dict[TCPNode, _Conn] = {}  # outgoing in any state, incoming once open
        self._pending: set[_Conn] = set()  # incoming, not yet open
        self._connected: set[TCPNode] = set()  # what SyncObj was told is connected
        self._last_attempt: dict[TCPNode, float] = {}
        self._server: socket.socket | None = None
        self._ready = False
        self._last_bind: float | None = None
        self._bind_attempts = 0
        self._bind_over = threading.Event()
        self._destroyed = False
        self._last_warning: dict[str, float] = {}
        for node in otherNodes:
            self.addNode(node)
        syncObj.addOnTickCallback(self._on_tick)
        type(self).instances.add(self)

    # --- pysyncobj Transport API ----------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready

    def tryGetReady(self) -> None:  # noqa: N802
        """Bind the listening socket (retried every ``conf.bindRetryTime``)."""
        self._maybe_bind()

    def waitReady(self) -> None:  # noqa: N802
        """Block until bound; call from another thread than SyncObj's tick thread."""
        self._bind_over.wait()
        if not self._ready:
            raise TransportNotReadyError

    def addNode(self, node: Any) -> None:  # noqa: N802
        if not isinstance(node, TCPNode):
            raise TypeError(f"TlsTransport needs TCPNode peers, got {node!r}")
        self._nodes.add(node)
        self._by_address[node.address] = node

    def dropNode(self, node: Any) -> None:  # noqa: N802
        """Forget ``node``; its connection is closed (SyncObj hears it disconnect)."""
        self._nodes.discard(node)
        if isinstance(node, TCPNode):
            self._by_address.pop(node.address, None)
        self._last_attempt.pop(node, None)
        conn = self._conns.get(node)
        if conn is not None:
            conn.close()

    def send(self, node: Any, message: Any) -> bool:
        """Queue ``message`` for ``node``; False when it is not connected (as pysyncobj)."""
        conn = self._conns.get(node)
        if conn is None or conn.state is not _State.OPEN:
            return False
        if conn.backlog > SEND_BACKLOG and _droppable(message):
            conn.flush()  # the kernel may have room by now (the tick can be long)
            if conn.state is not _State.OPEN:
                return False
            if conn.backlog > SEND_BACKLOG:
                self.dropped_messages += 1
                log.debug("raft: %r is %d bytes behind; append_entries dropped", conn,
                          conn.backlog)
                return False
        if self.tls.before_send is not None:
            self.tls.before_send()
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if len(payload) > self.tls.max_frame:
            log.error("raft: a %d-byte message to %s exceeds max_frame %d; not sent",
                      len(payload), node, self.tls.max_frame)
            return False
        conn.send_frame(payload)
        return conn.state is _State.OPEN

    def destroy(self) -> None:
        self._destroyed = True
        self.setOnMessageReceivedCallback(None)
        self.setOnNodeConnectedCallback(None)
        self.setOnNodeDisconnectedCallback(None)
        self.setOnReadonlyNodeConnectedCallback(None)
        self.setOnReadonlyNodeDisconnectedCallback(None)
        self._syncobj.removeOnTickCallback(self._on_tick)
        for conn in [*self._pending, *self._conns.values()]:
            conn.close()
        self._connected.clear()
        self._unbind()
        self._bind_over.set()

    # --- extras ---------------------------------------------------------------------------

    @property
    def connected_nodes(self) -> frozenset[TCPNode]:
        return frozenset(self._connected)

    @property
    def address(self) -> str:
        return str(self._self.address)

    # --- listening ------------------------------------------------------------------------

    def _maybe_bind(self) -> None:
        now = time.monotonic()
        if self._ready or self._destroyed or (
                self._last_bind is not None and now < self._last_bind + self._conf.bindRetryTime):
            return
        self._last_bind = now
        try:
            self._bind()
        except OSError as exc:
            self._bind_attempts += 1
            log.warning("raft: cannot listen for %s: %s", self._self.address, exc)
            if self._conf.maxBindRetries and self._bind_attempts >= self._conf.maxBindRetries:
                self._bind_over.set()
                raise TransportNotReadyError from exc
        else:
            self._ready = True
            self._bind_over.set()

    def _bind(self) -> None:
        # like pysyncobj's TCPTransport: conf.bindAddress, else all interfaces on our port
        if self._conf.bindAddress is not None:
            host, port = self._conf.bindAddress.rsplit(":", 1)
            if host not in ("0.0.0.0", "::"):
                host = globalDnsResolver().resolve(host)
        else:
            host = "::" if ":" in self._self.host else "0.0.0.0"
            port = str(self._self.port)
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                             socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setblocking(False)
            sock.bind((host, int(port)))
            sock.listen(64)
        except OSError:
            sock.close()
            raise
        self._server = sock
        self._poller.subscribe(sock.fileno(), self._on_accept, _READ | _ERROR)
        log.info("raft: listening on %s:%s (TLS)", host, port)

    def _unbind(self) -> None:
        if self._server is not None:
            self._poller.unsubscribe(self._server.fileno())
            self._server.close()
            self._server = None
        self._ready = False

    def _on_accept(self, descr: int, event: int) -> None:
        server = self._server
        if server is None or descr != server.fileno():
            return
        if event & _ERROR:
            log.warning("raft: listening socket failed; binding again")
            self._unbind()
            return
        for _ in range(ACCEPTS_PER_EVENT):
            try:
                sock, addr = server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("raft: accept failed: %s", exc)
                return
            peer = f"{addr[0]}:{addr[1]}"
            if len(self._pending) >= MAX_UNAUTHENTICATED:
                sock.close()
                self._count_refusal(None, "too_many_pending",
                                    f"{peer}: {MAX_UNAUTHENTICATED} handshakes in progress")
                continue
            try:
                self._setup_socket(sock)
                conn = _Conn(self, sock, outgoing=False, node=None, peer=peer,
                             deadline=time.monotonic() + self._conf.connectionTimeout)
            except OSError as exc:
                log.debug("raft: dropping %s: %s", peer, exc)
                sock.close()
                continue
            self._pending.add(conn)

    def _setup_socket(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._conf.sendBufferSize)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._conf.recvBufferSize)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._conf.tcp_keepalive is not None:
            set_keepalive(sock, *self._conf.tcp_keepalive)

    # --- dialling -------------------------------------------------------------------------

    def _dials(self, node: TCPNode) -> bool:
        """pysyncobj's tie-break: the node with the greater address connects."""
        return bool(self._self.address > node.address)

    def _maybe_connect(self, node: TCPNode) -> None:
        if node in self._conns or not self._dials(node):
            return
        now = time.monotonic()
        last = self._last_attempt.get(node)
        if last is not None and now - last < self._conf.connectionRetryTime:
            return
        self._last_attempt[node] = now
        ip = node.ip
        if ip is None:
            log.debug("raft: cannot resolve %s", node.host)
            return
        sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET,
                             socket.SOCK_STREAM)
        try:
            self._setup_socket(sock)
            err = sock.connect_ex((ip, node.port))
            if err and err not in _IN_PROGRESS:
                raise OSError(err, errno.errorcode.get(err, str(err)))
            conn = _Conn(self, sock, outgoing=True, node=node, peer=node.address,
                         deadline=now + self._conf.connectionTimeout)
        except OSError as exc:
            log.debug("raft: cannot connect to %s: %s", node.address, exc)
            sock.close()
            return
        self._conns[node] = conn

    def _on_tick(self) -> None:
        """SyncObj's tick: bind, time out handshakes, (re)connect.  Reconnects happen here and
        not inside poller callbacks, so a socket opened mid-poll cannot inherit a stale event of
        the descriptor number it reuses."""
        if self._destroyed:
            return
        try:
            self._maybe_bind()
        except TransportNotReadyError:
            pass
        now = time.monotonic()
        late = [c for c in (*self._pending, *self._conns.values())
                if c.state is not _State.OPEN and c.deadline < now]
        for conn in late:
            if conn.outgoing:
                log.debug("raft: %r timed out", conn)
                conn.close()
            else:
                conn.refuse("handshake_timeout", "no TLS handshake and hello in time")
        for node in list(self._nodes):
            self._maybe_connect(node)

    # --- connection events ----------------------------------------------------------------

    def _authenticate(self, conn: _Conn) -> None:
        """The TLS handshake is done: ask ``authorize`` before anything else happens."""
        try:
            name = self.tls.authorize(conn.peer_certificate())
        except Exception as exc:  # noqa: BLE001 - any exception refuses the peer
            reason = getattr(exc, "reason", None)
            conn.refuse(reason if isinstance(reason, str) and reason else "unauthorized",
                        f"{type(exc).__name__}: {exc}")
            return
        conn.peer_name = name
        conn.state = _State.HELLO
        if conn.outgoing:
            assert conn.node is not None
            if not self._pinned(conn, conn.node.address):
                return
            conn.send_frame(HELLO + self._self.address.encode())

    def _frame(self, conn: _Conn, payload: bytes) -> None:
        if conn.state is _State.OPEN:
            self._deliver(conn, payload)
        elif conn.outgoing:
            self._on_ack(conn, payload)
        else:
            self._on_hello(conn, payload)

    def _on_ack(self, conn: _Conn, payload: bytes) -> None:
        if payload != ACK:
            conn.refuse("bad_hello", "the peer did not acknowledge our hello")
            return
        node = conn.node
        assert node is not None
        conn.state = _State.OPEN
        self._connected.add(node)
        log.info("raft: connected to %s (%s)", node.address, conn.peer_name)
        self._onNodeConnected(node)

    def _on_hello(self, conn: _Conn, payload: bytes) -> None:
        if not payload.startswith(HELLO):
            conn.refuse("bad_hello", "the first frame is not a hello")
            return
        try:
            address = payload[len(HELLO):].decode("utf-8")
        except UnicodeDecodeError:
            conn.refuse("bad_hello", "the hello's address is not UTF-8")
            return
        node = self._by_address.get(address)
        if node is None:
            conn.refuse("unknown_node", f"{address!r} is not a member")
            return
        if self._dials(node):
            conn.refuse("wrong_direction", f"{address} must be dialled by us, not dial us")
            return
        if not self._pinned(conn, address):
            return
        self._pending.discard(conn)
        old = self._conns.pop(node, None)
        if old is not None:
            log.info("raft: %s reconnected; closing its old connection", address)
            old.close()
        if node in self._connected:
            self._connected.discard(node)
            self._onNodeDisconnected(node)
        conn.node = node
        conn.state = _State.OPEN
        self._conns[node] = conn
        conn.send_frame(ACK)
        if conn.state is not _State.OPEN:
            return
        self._connected.add(node)
        log.info("raft: %s (%s) connected", address, conn.peer_name)
        self._onNodeConnected(node)

    def _deliver(self, conn: _Conn, payload: bytes) -> None:
        try:
            message = _PlainDataUnpickler(io.BytesIO(payload)).load()
        except Exception as exc:  # noqa: BLE001 - any decoding failure drops the peer
            conn.refuse("bad_frame", f"undecodable message ({type(exc).__name__}: {exc})")
            return
        self.delivered_messages += 1
        self.delivered_bytes += len(payload)
        if conn.node is not None:
            self.last_heard[conn.node.address] = time.monotonic()
        try:
            self._onMessageReceived(conn.node, message)
        except Exception:  # noqa: BLE001 - a message SyncObj chokes on costs the connection
            log.exception("raft: a message from %r broke the Raft layer; dropping the peer",
                          conn)
            conn.close()

    def _closed(self, conn: _Conn) -> None:
        self._pending.discard(conn)
        node = conn.node
        if node is None or self._conns.get(node) is not conn:
            return
        del self._conns[node]
        if node in self._connected:
            self._connected.discard(node)
            log.info("raft: disconnected from %s", node.address)
            self._onNodeDisconnected(node)

    def _pinned(self, conn: _Conn, address: str) -> bool:
        """Whether the peer's certificate may be the member at ``address`` (``node_names``);
        if not, ``conn`` is closed.  A certificate of another node than the one pinned there
        is refused (``wrong_node``: someone claims a member's place).  An address with no
        pinned name yet is only deferred: after a restart gossip names the members a moment
        after Raft started from the saved configuration, and the peer tries again."""
        names = self.tls.node_names
        if names is None:
            return True
        expected = names.get(address)
        if expected is None:
            conn.refuse("unknown_address", f"no member name is known for {address} yet (its "
                        f"certificate names {conn.peer_name!r}); closed until gossip names it",
                        security=False)
            return False
        if conn.peer_name != expected:
            conn.refuse("wrong_node", f"{address} must be {expected!r}, its certificate "
                                      f"names {conn.peer_name!r}")
            return False
        return True

    def _warn(self, key: str, msg: str, *args: object, level: int = logging.WARNING) -> None:
        """A warning (or ``level``) at most every LOG_EVERY seconds per ``key`` (the rest at
        debug): refused peers retry, and scanners would flood the log."""
        now = time.monotonic()
        if now - self._last_warning.get(key, -LOG_EVERY) >= LOG_EVERY:
            self._last_warning[key] = now
        else:
            level = logging.DEBUG
        log.log(level, msg, *args)

    def _count_deferral(self, conn: _Conn, reason: str, detail: str) -> None:
        self.deferred[reason] += 1
        self._warn(f"deferred:{reason}", "raft: closed %r, to be tried again: %s (%s)",
                   conn, reason, detail, level=logging.INFO)
        if self.tls.on_deferred is not None:
            try:
                self.tls.on_deferred(reason)
            except Exception:  # noqa: BLE001 - metrics must not break the transport
                log.exception("raft: on_deferred failed")

    def _count_refusal(self, conn: _Conn | None, reason: str, detail: str) -> None:
        self.refused[reason] += 1
        self._warn(f"refused:{reason}", "raft: refused %s: %s (%s)",
                   conn if conn is not None else "connection", reason, detail)
        if self.tls.on_refused is not None:
            try:
                self.tls.on_refused(reason)
            except Exception:  # noqa: BLE001 - metrics must not break the transport
                log.exception("raft: on_refused failed")
