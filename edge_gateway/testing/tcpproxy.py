"""A TCP fault proxy on loopback, for outage tests and benchmarks.

Put it between a client and a server (moto's S3 server, the metadata
server, another gateway) and change what the network does at run time::

    with TcpProxy("127.0.0.1", moto_port) as proxy:
        config = S3Config(..., endpoint_url=proxy.url)
        ...
        proxy.set_mode(ProxyMode.BLACKHOLE)      # the link silently drops everything
        ...
        proxy.set_mode(ProxyMode.PASS)           # healed: held bytes flow again

Modes (:class:`ProxyMode`):

``pass``
    Forward both ways.
``latency``
    Forward both ways, each chunk delayed by ``latency`` seconds (order kept;
    throughput is not limited).
``refuse``
    The server is gone: the listening socket is closed, so new connections
    get ``ECONNREFUSED``, and every open connection is reset (RST to both
    ends). Leaving the mode listens again on the same port.
``blackhole``
    A partition: connections are still accepted (as a kernel would, for a
    peer whose answers never come back) but nothing is forwarded either way,
    on new and open connections alike. Bytes received meanwhile are held
    (up to ``max_buffer`` per direction, then TCP flow control pushes back)
    and delivered when the mode returns to ``pass``/``latency``, as after a
    healed partition; new connections reach the upstream only then.
``reset``
    Every open connection is reset at once, and every new connection is
    accepted and reset immediately (the client sees ``ECONNRESET``).
``drop-responses``
    A one-way partition: requests reach the upstream, but nothing it sends
    back reaches the client (held as in ``blackhole``). The server acts on
    a request whose answer the client never sees: the lost-response case of
    a commit protocol.
``stall-body``
    Every HTTP answer stalls half way through its body: the client gets the
    status line, the headers and the first half of the body (by its
    ``Content-Length``; none of a body without one), then nothing more
    while the mode lasts; requests still reach the upstream. This is the
    link that dies in the middle of a download, error answers (a 404's XML
    body) included; a client sees a read timeout *while reading a body*,
    not while waiting for an answer. The rest is held and delivered when
    the mode changes (to a client that usually gave up meanwhile).
    Answers are told apart by the requests between them (one request, one
    answer, as HTTP/1.1 clients without pipelining do); ``1xx`` interim
    answers pass whole. Answers cut so far are counted by status in
    :attr:`ProxyStats.stalled`.

The proxy runs one thread with a :mod:`selectors` loop (no trio, no asyncio),
so it serves sync tests, trio tests, benchmarks and other processes alike.
:meth:`TcpProxy.set_mode` may be called from any thread and returns once the
mode is in effect (the loop applies it within microseconds; a trio caller
blocks its loop only that long). Other processes can also drive one: run
``python -m edge_gateway.testing.tcpproxy HOST:PORT`` and write modes
(``pass``, ``refuse``, ``blackhole``, ``reset``, ``stall-body``, ``latency 0.2``) to its
stdin, one per line; it prints its port first, then ``ok <mode>`` per command.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import enum
import errno
import random
import re
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final, Self

__all__ = ["ProxyMode", "ProxyStats", "TcpProxy"]

_CHUNK: Final = 256 * 1024
_LINGER_RST: Final = struct.pack("ii", 1, 0)
#: Ports picked for a proxy lie below Linux's ephemeral range, so that no
#: outgoing connection takes the port in the instant ``refuse`` re-binds it.
_PORT_RANGE: Final = (20_000, 32_000)
_COMMAND_TIMEOUT: Final = 10.0


class ProxyMode(enum.StrEnum):
    """What the proxy does with connections (see the module docstring)."""

    PASS = "pass"  # noqa: S105 (a mode, not a password)
    LATENCY = "latency"
    REFUSE = "refuse"
    BLACKHOLE = "blackhole"
    RESET = "reset"
    DROP_RESPONSES = "drop-responses"
    STALL_BODY = "stall-body"


_UP_FLOWS: Final = frozenset(
    {ProxyMode.PASS, ProxyMode.LATENCY, ProxyMode.DROP_RESPONSES, ProxyMode.STALL_BODY}
)
#: In ``stall-body`` the answers flow up to their cut (see :class:`_Answer`).
_DOWN_FLOWS: Final = frozenset({ProxyMode.PASS, ProxyMode.LATENCY, ProxyMode.STALL_BODY})
#: An answer's header block longer than this is not looked into (never cut).
_MAX_HEAD: Final = 64 * 1024
_HEAD_END: Final = b"\r\n\r\n"
_CONTENT_LENGTH: Final = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)[ \t]*\r\n", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class ProxyStats:
    """Counters since :meth:`TcpProxy.start`."""

    mode: ProxyMode
    latency: float
    #: Connections accepted from clients (including those reset at once).
    accepted: int
    #: Connections open now.
    active: int
    #: Connections the proxy ended with a reset (by a mode, or because the
    #: upstream refused or reset them).
    resets: int
    bytes_to_upstream: int
    bytes_to_client: int
    #: Answers ``stall-body`` cut half way, by HTTP status (e.g. ``{404: 3, 200: 1}``).
    stalled: dict[int, int] = field(default_factory=dict)


class _Answer:
    """Where the HTTP answer now flowing to the client stands, for ``stall-body``.

    It follows the bytes *sent* to the client in every mode, so that a switch
    to ``stall-body`` in the middle of an answer cuts that answer at the
    right place. An answer begins when the client sent a request and every
    earlier byte had reached it; it is its header block (up to the blank
    line) and then a body whose first ``cut`` bytes may pass.
    """

    __slots__ = ("body_sent", "counted", "cut", "head", "status")

    def __init__(self) -> None:
        self.head = bytearray()
        #: Body bytes that pass before the stall; ``None`` until the header
        #: block is complete (header bytes always pass).
        self.cut: int | None = None
        self.body_sent = 0
        self.status = 0
        self.counted = False  # this answer's stall is in the statistics

    def restart(self) -> None:
        """A new request: the next bytes from the upstream begin a new answer."""
        self.head.clear()
        self.cut = None
        self.body_sent = self.status = 0
        self.counted = False

    def sendable(self, data: memoryview) -> int:
        """How many of ``data`` (the next bytes for the client) may pass before the cut."""
        if self.cut is None:
            end = self._head_end(data)
            # The header block passes whole, up to its blank line; what follows
            # is decided once it is parsed (by sent()).
            return len(data) if end is None else end
        return max(0, min(len(data), self.cut - self.body_sent))

    def sent(self, data: memoryview) -> None:
        """``data`` reached the client: move along the answer."""
        while data:
            if self.cut is not None:
                self.body_sent += len(data)
                return
            end = self._head_end(data)
            if end is None:
                self.head += data[: _MAX_HEAD + 1]
                if len(self.head) > _MAX_HEAD:
                    self.cut = 1 << 62  # not an answer we understand: never cut
                return
            self.head += data[:end]
            data = data[end:]
            self._parse_head()

    def _head_end(self, data: memoryview) -> int | None:
        """The offset in ``data`` just past the header block's blank line, if it is there."""
        tail = bytes(self.head[-3:])
        at = (tail + bytes(data[: len(_HEAD_END) - 1 + _MAX_HEAD])).find(_HEAD_END)
        if at < 0:
            return None
        return at + len(_HEAD_END) - len(tail)

    def _parse_head(self) -> None:
        head = bytes(self.head)
        try:
            status = int(head.split(b" ", 2)[1])
        except (IndexError, ValueError):
            status = 0
        if 100 <= status < 200:
            self.head.clear()  # an interim answer (100 Continue): the real one follows
            return
        self.status = status
        length = _CONTENT_LENGTH.search(head)
        # Half the body (a 1-byte body stalls before it); without a length
        # (chunked, or ended by closing) right after the headers.
        self.cut = int(length.group(1)) // 2 if length else 0


class _Pipe:
    """One direction of a connection: bytes read from ``src`` waiting to go to ``dst``."""

    __slots__ = ("buffered", "chunks", "eof", "shut")

    def __init__(self) -> None:
        # (due time, data): chunks leave in order, none before its due time.
        self.chunks: collections.deque[tuple[float, memoryview]] = collections.deque()
        self.buffered = 0
        self.eof = False  # src sent FIN
        self.shut = False  # the FIN was passed on to dst


class _Conn:
    __slots__ = ("answer", "client", "connected", "down", "up", "upstream")

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.upstream: socket.socket | None = None
        self.connected = False  # the upstream connect completed
        self.up = _Pipe()  # client -> upstream
        self.down = _Pipe()  # upstream -> client
        self.answer = _Answer()  # the HTTP answer in self.down (stall-body)


def _reset(sock: socket.socket) -> None:
    """Close with a TCP RST rather than a FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    sock.close()


class TcpProxy:
    """A fault-injecting TCP proxy from ``host:port`` to ``upstream_host:upstream_port``.

    ``port=0`` picks a free port (below the ephemeral range). Use as a
    context manager or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        mode: ProxyMode | str = ProxyMode.PASS,
        latency: float = 0.0,
        max_buffer: int = 4 * 1024 * 1024,
    ) -> None:
        if max_buffer < 1:
            raise ValueError("max_buffer must be >= 1")
        self.upstream = (upstream_host, upstream_port)
        self.host = host
        self._port = port
        self._mode, self._latency = self._check_mode(mode, latency)
        self._max_buffer = max_buffer
        self._selector: selectors.BaseSelector | None = None
        self._listener: socket.socket | None = None
        self._listening = False
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._conns: set[_Conn] = set()
        self._commands: collections.deque[tuple[Callable[[], object], _Reply]] = collections.deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._failure: BaseException | None = None
        self._accepted = self._resets = 0
        self._bytes_up = self._bytes_down = 0
        #: Replaced, never changed in place: statistics() reads it from other threads.
        self._stalled: dict[int, int] = {}

    # ----------------------------------------------------------- public API

    @property
    def port(self) -> int:
        """The port clients connect to (known once started)."""
        if not self._port:
            raise RuntimeError("the proxy is not started")
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def url(self) -> str:
        """``http://host:port``: an endpoint URL through the proxy."""
        return f"http://{self.host}:{self.port}"

    @property
    def mode(self) -> ProxyMode:
        return self._mode

    def start(self) -> Self:
        """Bind, listen and start the loop thread."""
        if self._thread is not None:
            raise RuntimeError("the proxy is already started")
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._bind()
        if self._mode is not ProxyMode.REFUSE:
            self._listen()
        self._thread = threading.Thread(
            target=self._run, name=f"tcpproxy:{self._port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close every connection and the listener; end the thread. Idempotent."""
        thread = self._thread
        if thread is None:
            return
        self._stopping = True
        self._wake()
        thread.join(timeout=_COMMAND_TIMEOUT)
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def set_mode(self, mode: ProxyMode | str, *, latency: float | None = None) -> None:
        """Switch mode; returns once it is in effect. ``latency`` (seconds) is for ``latency``."""
        new_mode, new_latency = self._check_mode(
            mode, self._latency if latency is None else latency
        )
        self._call(lambda: self._apply_mode(new_mode, new_latency))

    def reset_connections(self) -> int:
        """Reset every open connection now (the mode stays); returns how many."""
        result = self._call(self._reset_all)
        assert isinstance(result, int)
        return result

    def statistics(self) -> ProxyStats:
        return ProxyStats(
            mode=self._mode,
            latency=self._latency,
            accepted=self._accepted,
            active=len(self._conns),
            resets=self._resets,
            bytes_to_upstream=self._bytes_up,
            bytes_to_client=self._bytes_down,
            stalled=dict(self._stalled),
        )

    # --------------------------------------------------------- other threads

    @staticmethod
    def _check_mode(mode: ProxyMode | str, latency: float) -> tuple[ProxyMode, float]:
        try:
            checked = ProxyMode(mode)
        except ValueError:
            raise ValueError(
                f"unknown proxy mode {mode!r}; one of {[m.value for m in ProxyMode]}"
            ) from None
        if not latency >= 0:
            raise ValueError(f"latency must be >= 0 seconds, got {latency!r}")
        if checked is ProxyMode.LATENCY and not latency > 0:
            raise ValueError("mode 'latency' needs latency > 0")
        return checked, float(latency)

    def _call(self, fn: Callable[[], object]) -> object:
        if self._thread is None:
            raise RuntimeError("the proxy is not started")
        if not self._thread.is_alive():
            raise RuntimeError(f"the proxy loop died: {self._failure!r}")
        reply = _Reply()
        with self._lock:
            self._commands.append((fn, reply))
        self._wake()
        if not reply.done.wait(_COMMAND_TIMEOUT):
            raise RuntimeError(f"the proxy loop did not answer (failure: {self._failure!r})")
        if reply.error is not None:
            raise reply.error
        return reply.value

    def _wake(self) -> None:
        try:
            assert self._wake_w is not None
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass  # a wake-up is already pending, or the loop is gone

    # -------------------------------------------------------------- listener

    def _bind(self) -> None:
        candidates = [self._port] if self._port else []
        if not candidates:
            rng = random.Random()
            candidates = [rng.randrange(*_PORT_RANGE) for _ in range(50)] + [0]
        last: OSError | None = None
        for port in candidates:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((self.host, port))
            except OSError as exc:
                sock.close()
                last = exc
                continue
            sock.setblocking(False)
            self._listener = sock
            self._port = sock.getsockname()[1]
            return
        raise OSError(f"tcpproxy: cannot bind {self.host}:{candidates[-1]}: {last}")

    def _listen(self) -> None:
        if self._listening:
            return
        assert self._listener is not None
        assert self._selector is not None
        self._listener.listen(128)
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._listening = True

    def _unlisten(self, *, rebind: bool = True) -> None:
        """Stop listening; with ``rebind`` keep the port bound (connects are refused)."""
        if self._listener is None:
            return
        if self._listening:
            assert self._selector is not None
            self._selector.unregister(self._listener)
            self._listening = False
        # A listening socket cannot stop listening: close it (the kernel
        # resets connections still in its backlog) and hold the port with a
        # fresh socket that is bound but not listening, which refuses.
        self._listener.close()
        self._listener = None
        if rebind:
            deadline = time.monotonic() + 5.0
            while True:
                try:
                    self._bind()
                    return
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)

    # ------------------------------------------------------------------ loop

    def _run(self) -> None:
        sel = self._selector
        assert sel is not None
        try:
            while not self._stopping:
                for key, events in sel.select(self._timeout()):
                    sock = key.fileobj
                    if sock is self._wake_r:
                        self._drain_wake()
                    elif sock is self._listener:
                        self._accept()
                    else:
                        conn = key.data
                        assert isinstance(conn, _Conn)
                        assert isinstance(sock, socket.socket)
                        if conn in self._conns:
                            self._on_event(conn, sock, events)
                self._run_commands()
                self._flush_due()
        except BaseException as exc:
            self._failure = exc
            raise
        finally:
            for conn in list(self._conns):
                self._close(conn, reset=True)
            self._unlisten(rebind=False)
            self._fail_pending_commands()
            sel.close()
            for s in (self._wake_r, self._wake_w):
                if s is not None:
                    s.close()

    def _flows(self, conn: _Conn) -> tuple[bool, bool]:
        """Whether bytes may leave now towards the upstream, towards the client."""
        if not conn.connected:
            return False, False
        return self._mode in _UP_FLOWS, self._mode in _DOWN_FLOWS

    def _timeout(self) -> float | None:
        if self._mode not in _UP_FLOWS:
            return None
        due = [
            pipe.chunks[0][0]
            for conn in self._conns
            for pipe, flows in zip((conn.up, conn.down), self._flows(conn), strict=True)
            if flows and pipe.chunks and not self._stalled_at_cut(conn, pipe)
        ]
        if not due:
            return None
        return max(0.0, min(due) - time.monotonic())

    def _drain_wake(self) -> None:
        assert self._wake_r is not None
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _run_commands(self) -> None:
        while True:
            with self._lock:
                if not self._commands:
                    return
                fn, reply = self._commands.popleft()
            try:
                reply.value = fn()
            except Exception as exc:  # noqa: BLE001 (re-raised in the calling thread)
                reply.error = exc
            reply.done.set()

    def _fail_pending_commands(self) -> None:
        with self._lock:
            pending = list(self._commands)
            self._commands.clear()
        for _, reply in pending:
            reply.error = RuntimeError("the proxy stopped")
            reply.done.set()

    def _apply_mode(self, mode: ProxyMode, latency: float) -> None:
        self._mode, self._latency = mode, latency
        if mode is ProxyMode.REFUSE:
            self._unlisten()
            self._reset_all()
            return
        self._listen()
        if mode is ProxyMode.RESET:
            self._reset_all()
            return
        for conn in list(self._conns):
            if conn.upstream is None and mode in _UP_FLOWS:
                self._connect_upstream(conn)
            if conn in self._conns:
                self._update(conn)

    def _reset_all(self) -> int:
        conns = list(self._conns)
        for conn in conns:
            self._close(conn, reset=True)
        return len(conns)

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                client, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    return  # out of descriptors: leave them in the backlog
                raise
            self._accepted += 1
            if self._mode is ProxyMode.RESET:
                self._resets += 1
                _reset(client)
                continue
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(client)
            self._conns.add(conn)
            assert self._selector is not None
            self._selector.register(client, selectors.EVENT_READ, conn)
            if self._mode in _UP_FLOWS:
                self._connect_upstream(conn)
            if conn in self._conns:
                self._update(conn)

    def _connect_upstream(self, conn: _Conn) -> None:
        up = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        up.setblocking(False)
        up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.upstream = up
        err = up.connect_ex(self.upstream)
        assert self._selector is not None
        self._selector.register(up, selectors.EVENT_WRITE, conn)
        if err == 0:
            conn.connected = True
        elif err not in (errno.EINPROGRESS, errno.EWOULDBLOCK):
            self._close(conn, reset=True)

    # ------------------------------------------------------------- transfer

    def _on_event(self, conn: _Conn, sock: socket.socket, events: int) -> None:
        if sock is conn.upstream and not conn.connected:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self._close(conn, reset=True)  # the upstream refused: so do we
                return
            conn.connected = True
        if events & selectors.EVENT_READ:
            pipe = conn.up if sock is conn.client else conn.down
            try:
                data = sock.recv(_CHUNK)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                self._close(conn, reset=True)  # reset by a peer: pass it on
                return
            if data is not None:
                if data and pipe is conn.up and not conn.down.chunks:
                    # A request, and every byte of the last answer was
                    # delivered: what the upstream sends next is a new answer.
                    conn.answer.restart()
                if data:
                    pipe.chunks.append((time.monotonic() + self._delay(), memoryview(data)))
                    pipe.buffered += len(data)
                else:
                    pipe.eof = True
                    if conn.upstream is None and not pipe.chunks:
                        # A client that gave up while its connection was held
                        # (blackhole): nothing to deliver, nobody to tell.
                        self._close(conn, reset=False)
                        return
        if conn in self._conns:
            self._pump(conn)

    def _delay(self) -> float:
        return self._latency if self._mode is ProxyMode.LATENCY else 0.0

    def _flush_due(self) -> None:
        if self._mode not in _UP_FLOWS:
            return
        now = time.monotonic()
        for conn in list(self._conns):
            if any(
                p.chunks and p.chunks[0][0] <= now and not self._stalled_at_cut(conn, p)
                for p in (conn.up, conn.down)
            ):
                self._pump(conn)

    def _pump(self, conn: _Conn) -> None:
        """Send what is due in both directions, pass FINs on, update the interest set."""
        flows = self._flows(conn)
        if any(flows):
            assert conn.upstream is not None
            for pipe, dst, flowing in (
                (conn.up, conn.upstream, flows[0]),
                (conn.down, conn.client, flows[1]),
            ):
                if not flowing:
                    continue
                if not self._send(conn, pipe, dst):
                    return
                if pipe.eof and not pipe.chunks and not pipe.shut:
                    pipe.shut = True
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
            if conn.up.shut and conn.down.shut:
                self._close(conn, reset=False)
                return
        self._update(conn)

    def _stalled_at_cut(self, conn: _Conn, pipe: _Pipe) -> bool:
        """Whether ``pipe``'s next bytes wait at a ``stall-body`` cut (and counts the stall)."""
        if self._mode is not ProxyMode.STALL_BODY or pipe is not conn.down or not pipe.chunks:
            return False
        answer = conn.answer
        if answer.sendable(pipe.chunks[0][1]):
            return False
        if not answer.counted:
            answer.counted = True
            self._stalled = {
                **self._stalled,
                answer.status: self._stalled.get(answer.status, 0) + 1,
            }
        return True

    def _send(self, conn: _Conn, pipe: _Pipe, dst: socket.socket) -> bool:
        now = time.monotonic()
        towards_client = dst is conn.client
        while pipe.chunks and pipe.chunks[0][0] <= now:
            due, data = pipe.chunks[0]
            limit = len(data)
            if towards_client and self._mode is ProxyMode.STALL_BODY:
                limit = conn.answer.sendable(data)
                if not limit:
                    self._stalled_at_cut(conn, pipe)
                    return True
            try:
                sent = dst.send(data[:limit])
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                self._close(conn, reset=True)
                return False
            if towards_client:
                conn.answer.sent(data[:sent])
                self._bytes_down += sent
            else:
                self._bytes_up += sent
            pipe.buffered -= sent
            if sent < len(data):
                pipe.chunks[0] = (due, data[sent:])
                return True
            pipe.chunks.popleft()
        return True

    def _update(self, conn: _Conn) -> None:
        sel = self._selector
        assert sel is not None
        to_upstream, to_client = self._flows(conn)
        now = time.monotonic()
        for sock, inbound, outbound, flowing in (
            (conn.client, conn.up, conn.down, to_client),
            (conn.upstream, conn.down, conn.up, to_upstream),
        ):
            if sock is None:
                continue
            events = 0
            if sock is conn.upstream and not conn.connected:
                events = selectors.EVENT_WRITE
            else:
                if not inbound.eof and inbound.buffered < self._max_buffer:
                    events |= selectors.EVENT_READ
                if (
                    flowing
                    and outbound.chunks
                    and outbound.chunks[0][0] <= now
                    and not self._stalled_at_cut(conn, outbound)
                ):
                    events |= selectors.EVENT_WRITE
            try:
                if events:
                    sel.modify(sock, events, conn)
                else:
                    sel.unregister(sock)
            except KeyError:
                if events:
                    sel.register(sock, events, conn)

    def _close(self, conn: _Conn, *, reset: bool) -> None:
        self._conns.discard(conn)
        if reset:
            self._resets += 1
        assert self._selector is not None
        for sock in (conn.client, conn.upstream):
            if sock is None:
                continue
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)
            if reset:
                _reset(sock)
            else:
                sock.close()


class _Reply:
    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: object = None
        self.error: Exception | None = None


def main(argv: list[str] | None = None) -> int:
    """Run a proxy driven by commands on stdin (for scenarios in other processes)."""
    parser = argparse.ArgumentParser(prog="python -m edge_gateway.testing.tcpproxy")
    parser.add_argument("upstream", help="HOST:PORT to forward to")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: pick one)")
    args = parser.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    with TcpProxy(host or "127.0.0.1", int(port), port=args.port) as proxy:
        print(proxy.port, flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] in ("quit", "exit"):
                break
            try:
                latency = float(words[1]) if len(words) > 1 else None
                proxy.set_mode(words[0], latency=latency)
            except ValueError as exc:
                print(f"error {exc}", flush=True)
                continue
            print(f"ok {proxy.mode}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
