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

Shape
-----

Apart from the mode, the link has a shape (:class:`LinkShape`, set with
``shape=`` or :meth:`TcpProxy.set_shape`; all 0 by default): what a real link
does when it works. It applies in every mode, to whatever the mode lets
through::

    proxy.set_shape(LinkShape(up_bytes_per_s=250_000, down_bytes_per_s=1_000_000,
                              latency_s=0.3, jitter_s=0.05, reset_rate=0.1,
                              slow_start_s=2, seed=7))

``up_bytes_per_s``, ``down_bytes_per_s``
    A bandwidth cap per direction (up: towards the upstream), shared by all
    the proxy's connections (a link is one pipe; connections take turns, a
    slice each). A token bucket per direction paces the sends in slices of
    about 10 ms of the cap (1 KiB to 256 KiB) and saves up at most about
    50 ms of it while idle (:meth:`LinkShape.burst_bytes`), so moving ``n``
    bytes one way takes at least ``(n - burst) / cap`` seconds, and a
    saturating load gets the cap within a percent over seconds
    (``bench/proxy.py``). A capped direction queues little in the proxy
    (about 250 ms of the cap plus the latency, like a router's queue) before
    TCP flow control pushes back on the sender.
``latency_s``, ``jitter_s``
    Every chunk the proxy reads is held ``latency_s`` plus a uniform draw in
    ``[-jitter_s, +jitter_s]`` (``jitter_s`` is at most ``latency_s``), each
    way; a chunk never overtakes the one before it (order is kept, so a
    chunk may wait longer than its draw). The ``latency`` mode's delay adds
    to it. Bytes in flight count against the queue (``max_buffer`` without
    a cap), as a TCP window would.
``reset_rate``
    Random resets: each open connection is reset (RST to both ends) after an
    exponentially distributed time of mean ``1 / reset_rate`` seconds (a
    Poisson process: ``reset_rate`` resets per connection-second). Counted in
    :attr:`ProxyStats.random_resets`.
``slow_start_s``
    After a connection is opened (its upstream connect completed: after a
    reconnect, or when a ``blackhole`` heals), its caps ramp linearly from
    10% to 100% over this many seconds, like TCP's slow start. Per
    connection; it only slows a capped direction.
``seed``
    The jitter and the resets are drawn from :class:`random.Random` seeded
    with it (two streams, so the reset schedule does not depend on how bytes
    were cut into chunks); every :meth:`TcpProxy.set_shape` reseeds. A run
    that opens connections in the same order gets the same draws.

A new shape takes effect at once: caps and slow start for the bytes still
queued, latency and jitter for bytes read from then on, resets redrawn for
every open connection.

Running it
----------

The proxy runs one thread with a :mod:`selectors` loop (no trio, no asyncio),
so it serves sync tests, trio tests, benchmarks and other processes alike.
The loop sleeps in ``select`` until a socket is ready or the next timer (a
held chunk coming due, the tokens for a slice, a random reset); it never
polls. :meth:`TcpProxy.set_mode` and :meth:`TcpProxy.set_shape` may be
called from any thread and return once the change is in effect (the loop
applies it within microseconds; a trio caller blocks its loop only that
long). Other processes can also drive one: run
``python -m edge_gateway.testing.tcpproxy HOST:PORT [--shape 'up=1e6 latency=0.1']``
and write commands to its stdin, one per line: a mode (``pass``, ``refuse``,
``blackhole``, ``reset``, ``drop-responses``, ``stall-body``,
``latency 0.2``), or ``shape`` followed by ``name=value`` pairs (``up``,
``down``, ``cap`` for both, ``latency``, ``jitter``, ``resets``,
``slow_start``, ``seed``; a name left out is 0), or ``shape off``. It prints
its port first, then ``ok <mode>`` or ``ok shape <shape>`` per command
(``error <why>`` for a bad one); ``quit`` ends it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import enum
import errno
import math
import random
import re
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from types import TracebackType
from typing import ClassVar, Final, Self

from edge_gateway.testing.ports import port_range

__all__ = ["LinkShape", "ProxyMode", "ProxyStats", "TcpProxy"]

_CHUNK: Final = 256 * 1024
_LINGER_RST: Final = struct.pack("ii", 1, 0)
_COMMAND_TIMEOUT: Final = 10.0
#: Slow start begins at this fraction of the cap and ramps linearly to all of it.
_SLOW_START_FLOOR: Final = 0.1
#: A capped direction's queue in the proxy holds about this long of the cap
#: (plus the latency), like a router's queue, not ``max_buffer``.
_QUEUE_S: Final = 0.25
#: A quarter byte of slack when comparing tokens, so that float rounding never
#: makes the loop wake up a hair before a slice is allowed.
_SLACK: Final = 0.25


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
class LinkShape:
    """What the link between client and upstream is like, whatever the mode.

    Every field 0 (the default) means "as fast as loopback". Rates are in
    bytes per second of payload; ``up`` is client to upstream, ``down`` the
    way back. See the module docstring for how each one behaves.
    """

    #: Cap towards the upstream, shared by every connection (0: no cap).
    up_bytes_per_s: float = 0.0
    #: Cap towards the clients, shared by every connection (0: no cap).
    down_bytes_per_s: float = 0.0
    #: Added to every chunk's delay, both ways.
    latency_s: float = 0.0
    #: Each chunk's delay is ``latency_s`` plus a uniform draw in
    #: ``[-jitter_s, +jitter_s]`` (at most ``latency_s``), order kept.
    jitter_s: float = 0.0
    #: Resets per open connection per second (a Poisson process: each
    #: connection is reset after an exponential time of mean ``1/reset_rate``).
    reset_rate: float = 0.0
    #: A new connection's cap ramps from 10% to 100% over this many seconds.
    slow_start_s: float = 0.0
    #: Seeds the jitter and reset draws (reseeded on every :meth:`TcpProxy.set_shape`).
    seed: int = 0

    #: Names of the fields in the CLI's ``shape`` command.
    CLI_NAMES: ClassVar[dict[str, str]] = {
        "up": "up_bytes_per_s",
        "down": "down_bytes_per_s",
        "latency": "latency_s",
        "jitter": "jitter_s",
        "resets": "reset_rate",
        "slow_start": "slow_start_s",
        "seed": "seed",
    }

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "seed":
                if not isinstance(value, int) or isinstance(value, bool):
                    raise ValueError(f"seed must be an integer, got {value!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{f.name} must be a number, got {value!r}")
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{f.name} must be a finite number >= 0, got {value!r}")
        if self.jitter_s > self.latency_s:
            raise ValueError(
                f"jitter_s ({self.jitter_s}) must not exceed latency_s ({self.latency_s})"
            )

    @property
    def is_off(self) -> bool:
        """Whether the shape changes nothing (every field 0)."""
        return self == LinkShape(seed=self.seed)

    @staticmethod
    def slice_bytes(rate: float) -> int:
        """The piece a direction capped at ``rate`` sends at once: ~10 ms of it."""
        return min(_CHUNK, max(1024, int(rate * 0.01)))

    @staticmethod
    def burst_bytes(rate: float) -> int:
        """The most a direction capped at ``rate`` sends at once after idling: ~50 ms of it.

        Moving ``n`` bytes one way through the cap takes at least
        ``(n - burst_bytes(rate)) / rate`` seconds.
        """
        return max(LinkShape.slice_bytes(rate), int(rate * 0.05))

    @classmethod
    def parse(cls, words: list[str]) -> LinkShape:
        """A shape from the CLI's words: ``off``, or ``name=value`` pairs.

        ``cap=`` sets both caps; a field not named is 0.
        """
        if words == ["off"]:
            return cls()
        values: dict[str, float | int] = {}
        for word in words:
            name, eq, text = word.partition("=")
            names = ["up", "down"] if name == "cap" else [name]
            if not eq or any(n not in cls.CLI_NAMES for n in names):
                raise ValueError(
                    f"shape: expected off or name=value with name one of "
                    f"{[*cls.CLI_NAMES, 'cap']}, got {word!r}"
                )
            try:
                value: float | int = int(text) if name == "seed" else float(text)
            except ValueError:
                raise ValueError(f"shape: {name} needs a number, got {text!r}") from None
            for n in names:
                values[cls.CLI_NAMES[n]] = value
        return cls(**values)  # type: ignore[arg-type]

    def describe(self) -> str:
        """The CLI form: the fields that are not 0, or ``off``."""
        if self.is_off:
            return "off"
        return " ".join(
            f"{name}={getattr(self, attr):.15g}"
            for name, attr in self.CLI_NAMES.items()
            if getattr(self, attr)
        )


def _ramp_bytes(age: float, rate: float, span: float) -> float:
    """Bytes slow start lets a connection send in its first ``age`` seconds.

    The allowed rate grows linearly from ``_SLOW_START_FLOOR * rate`` at 0 to
    ``rate`` at ``span``; this is its integral.
    """
    f = _SLOW_START_FLOOR
    if age >= span:
        return rate * span * (1 + f) / 2 + rate * (age - span)
    return rate * (f * age + (1 - f) * age * age / (2 * span))


def _ramp_age(nbytes: float, rate: float, span: float) -> float:
    """The inverse of :func:`_ramp_bytes`: the age at which ``nbytes`` may have been sent."""
    if nbytes <= 0:
        return 0.0
    f = _SLOW_START_FLOOR
    full = rate * span * (1 + f) / 2
    if nbytes >= full:
        return span + (nbytes - full) / rate
    # (1 - f) / (2 span) a^2 + f a - nbytes / rate = 0
    a = (1 - f) / (2 * span)
    return (-f + math.sqrt(f * f + 4 * a * nbytes / rate)) / (2 * a)


class _Bucket:
    """A token bucket: ``rate`` bytes per second, at most ``burst`` saved up (sans-IO)."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self.burst = float(LinkShape.burst_bytes(rate))
        self.tokens = self.burst  # starts full
        self.stamp = now

    def available(self, now: float) -> float:
        return min(self.burst, self.tokens + max(0.0, now - self.stamp) * self.rate)

    def take(self, n: int, now: float) -> None:
        self.tokens = self.available(now) - n
        self.stamp = max(now, self.stamp)

    def ready_at(self, need: float, now: float) -> float:
        """When at least ``need`` tokens will be there (``need`` <= ``burst``)."""
        missing = need - _SLACK - self.available(now)
        return now if missing <= 0 else max(now, self.stamp) + missing / self.rate

    def set_rate(self, rate: float, now: float) -> None:
        self.tokens = self.available(now)
        self.stamp = max(now, self.stamp)
        self.rate = rate
        self.burst = float(LinkShape.burst_bytes(rate))
        self.tokens = min(self.tokens, self.burst)


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
    #: The link's shape now (:meth:`TcpProxy.set_shape`).
    shape: LinkShape = field(default_factory=LinkShape)
    #: Connections reset by the shape's ``reset_rate`` (also counted in ``resets``).
    random_resets: int = 0


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

    __slots__ = ("blocked", "buffered", "chunks", "down", "eof", "sent", "shut")

    def __init__(self, *, down: bool) -> None:
        self.down = down  # towards the client
        # (due time, data): chunks leave in order, none before its due time
        # (due times never decrease along the deque).
        self.chunks: collections.deque[tuple[float, memoryview]] = collections.deque()
        self.buffered = 0
        self.eof = False  # src sent FIN
        self.shut = False  # the FIN was passed on to dst
        #: dst took less than offered: wait until it is writable (not a timer).
        self.blocked = False
        self.sent = 0  # bytes passed to dst (slow start counts them)


class _Conn:
    __slots__ = (
        "answer",
        "client",
        "connected",
        "connected_at",
        "down",
        "reset_at",
        "up",
        "upstream",
    )

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.upstream: socket.socket | None = None
        self.connected = False  # the upstream connect completed
        self.connected_at = 0.0  # when (slow start counts from there)
        self.up = _Pipe(down=False)  # client -> upstream
        self.down = _Pipe(down=True)  # upstream -> client
        self.answer = _Answer()  # the HTTP answer in self.down (stall-body)
        #: When the shape's reset_rate resets this connection (None: never).
        self.reset_at: float | None = None


def _reset(sock: socket.socket) -> None:
    """Close with a TCP RST rather than a FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    sock.close()


class TcpProxy:
    """A fault-injecting TCP proxy from ``host:port`` to ``upstream_host:upstream_port``.

    ``port=0`` picks a free port (below the ephemeral range). ``mode`` and
    ``shape`` are the ones in effect from the start (change them with
    :meth:`set_mode` and :meth:`set_shape`). ``max_buffer`` bounds the bytes
    held per direction of a connection (a capped direction holds less: see
    the module docstring). Use as a context manager or call :meth:`start`
    and :meth:`stop`.
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
        shape: LinkShape | None = None,
    ) -> None:
        if max_buffer < 1:
            raise ValueError("max_buffer must be >= 1")
        if shape is not None and not isinstance(shape, LinkShape):
            raise TypeError(f"shape must be a LinkShape, got {shape!r}")
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
        #: Open connections, in the order they were accepted (a dict: ordered,
        #: so that reset draws and the shared cap's turns are reproducible).
        self._conns: dict[_Conn, None] = {}
        self._commands: collections.deque[tuple[Callable[[], object], _Reply]] = collections.deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._failure: BaseException | None = None
        self._accepted = self._resets = 0
        self._bytes_up = self._bytes_down = 0
        #: Replaced, never changed in place: statistics() reads it from other threads.
        self._stalled: dict[int, int] = {}
        self._shape = LinkShape()
        self._up_bucket: _Bucket | None = None
        self._down_bucket: _Bucket | None = None
        self._jitter_rng = random.Random()
        self._reset_rng = random.Random()
        self._random_resets = 0
        self._turn = 0  # rotates which connection the shared cap serves first
        self._apply_shape(shape or LinkShape())

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

    @property
    def shape(self) -> LinkShape:
        return self._shape

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

    def set_shape(self, shape: LinkShape) -> None:
        """Change the link's shape (``LinkShape()`` for none); returns once it is in effect.

        Caps and slow start apply at once to bytes still queued, latency and
        jitter to bytes read from now on; reset draws start over from the
        shape's seed.
        """
        if not isinstance(shape, LinkShape):
            raise TypeError(f"shape must be a LinkShape, got {shape!r}")
        self._call(lambda: self._apply_shape(shape))

    def reset_connections(self) -> int:
        """Reset every open connection now (the mode stays); returns how many."""
        result = self._call(self._reset_all)
        assert isinstance(result, int)
        return result

    def statistics(self) -> ProxyStats:
        """A consistent snapshot of the counters.

        While the loop runs it is taken by the loop, between two steps: bytes a
        peer has received are counted (no send is half accounted for).
        """
        thread = self._thread
        if thread is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop just stopped
                stats = self._call(self._statistics)
                assert isinstance(stats, ProxyStats)
                return stats
        return self._statistics()

    def _statistics(self) -> ProxyStats:
        return ProxyStats(
            mode=self._mode,
            latency=self._latency,
            accepted=self._accepted,
            active=len(self._conns),
            resets=self._resets,
            bytes_to_upstream=self._bytes_up,
            bytes_to_client=self._bytes_down,
            stalled=dict(self._stalled),
            shape=self._shape,
            random_resets=self._random_resets,
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
            # Below Linux's ephemeral range (and in this pytest-xdist worker's
            # slice of it), so that no outgoing connection takes the port in
            # the instant ``refuse`` re-binds it.
            candidates = [rng.randrange(*port_range()) for _ in range(50)] + [0]
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
                self._fire_resets()
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
        """Seconds until the next timer: a chunk due, tokens for a slice, a random reset.

        A pipe waiting for its socket to become writable (``blocked``) waits on
        the selector instead, so a slow reader never makes the loop spin.
        """
        now = time.monotonic()
        wake = math.inf
        for conn in self._conns:
            if conn.reset_at is not None:
                wake = min(wake, conn.reset_at)
            for pipe, flowing in zip((conn.up, conn.down), self._flows(conn), strict=True):
                if flowing and not pipe.blocked:
                    ready = self._ready_at(conn, pipe, now)
                    if ready is not None:
                        wake = min(wake, ready)
        if wake == math.inf:
            return None
        return max(0.0, wake - now)

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

    def _apply_shape(self, shape: LinkShape) -> None:
        now = time.monotonic()
        self._shape = shape
        self._up_bucket = self._rebucket(self._up_bucket, shape.up_bytes_per_s, now)
        self._down_bucket = self._rebucket(self._down_bucket, shape.down_bytes_per_s, now)
        # Separate streams, so that the reset schedule does not depend on how
        # the bytes happened to be cut into chunks.
        self._jitter_rng = random.Random(f"{shape.seed}:jitter")
        self._reset_rng = random.Random(f"{shape.seed}:resets")
        for conn in list(self._conns):
            self._draw_reset(conn, now)
            self._update(conn)

    @staticmethod
    def _rebucket(bucket: _Bucket | None, rate: float, now: float) -> _Bucket | None:
        if not rate:
            return None
        if bucket is None:
            return _Bucket(rate, now)
        bucket.set_rate(rate, now)  # keeps the tokens saved so far (up to the new burst)
        return bucket

    def _draw_reset(self, conn: _Conn, now: float) -> None:
        rate = self._shape.reset_rate
        conn.reset_at = now + self._reset_rng.expovariate(rate) if rate else None

    def _fire_resets(self) -> None:
        if not self._shape.reset_rate:
            return
        now = time.monotonic()
        for conn in list(self._conns):
            if conn.reset_at is not None and conn.reset_at <= now:
                self._random_resets += 1
                self._close(conn, reset=True)

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
            self._conns[conn] = None
            self._draw_reset(conn, time.monotonic())
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
            self._connected(conn)
        elif err not in (errno.EINPROGRESS, errno.EWOULDBLOCK):
            self._close(conn, reset=True)

    @staticmethod
    def _connected(conn: _Conn) -> None:
        conn.connected = True
        conn.connected_at = time.monotonic()

    # ------------------------------------------------------------- transfer

    def _on_event(self, conn: _Conn, sock: socket.socket, events: int) -> None:
        if sock is conn.upstream and not conn.connected:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self._close(conn, reset=True)  # the upstream refused: so do we
                return
            self._connected(conn)
        if events & selectors.EVENT_WRITE:
            (conn.down if sock is conn.client else conn.up).blocked = False
        if events & selectors.EVENT_READ:
            pipe = conn.up if sock is conn.client else conn.down
            try:
                data = sock.recv(self._recv_size(pipe))
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
                    pipe.chunks.append((self._due(pipe), memoryview(data)))
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

    def _due(self, pipe: _Pipe) -> float:
        """When bytes read now may leave: after latency and jitter, never before earlier ones."""
        delay = self._latency if self._mode is ProxyMode.LATENCY else 0.0
        shape = self._shape
        delay += shape.latency_s
        if shape.jitter_s:
            delay += self._jitter_rng.uniform(-shape.jitter_s, shape.jitter_s)
        due = time.monotonic() + max(0.0, delay)
        if pipe.chunks:
            due = max(due, pipe.chunks[-1][0])  # a chunk never overtakes the one before
        return due

    def _bucket(self, pipe: _Pipe) -> _Bucket | None:
        return self._down_bucket if pipe.down else self._up_bucket

    def _queue_limit(self, pipe: _Pipe) -> int:
        """Bytes held for ``pipe`` before the proxy stops reading its source."""
        bucket = self._bucket(pipe)
        if bucket is None:
            return self._max_buffer
        # A capped link queues a little more than its bandwidth-delay product,
        # like a router, so that a sender cannot park megabytes in the proxy.
        delay = self._shape.latency_s + self._shape.jitter_s + _QUEUE_S
        if self._mode is ProxyMode.LATENCY:
            delay += self._latency
        return min(self._max_buffer, max(64 * 1024, int(bucket.rate * delay)))

    def _recv_size(self, pipe: _Pipe) -> int:
        if self._bucket(pipe) is None:
            return _CHUNK
        return min(_CHUNK, max(4096, self._queue_limit(pipe) - pipe.buffered))

    def _allowance(self, conn: _Conn, pipe: _Pipe, now: float) -> float:
        """Bytes the caps (and slow start) let ``pipe`` send now; ``inf`` if uncapped."""
        bucket = self._bucket(pipe)
        if bucket is None:
            return math.inf
        allowed = bucket.available(now)
        span = self._shape.slow_start_s
        age = now - conn.connected_at
        if span and age < span:
            ramp = _ramp_bytes(age, bucket.rate, span) + LinkShape.slice_bytes(bucket.rate)
            allowed = min(allowed, ramp - pipe.sent)
        return allowed

    def _sendable(self, conn: _Conn, pipe: _Pipe) -> int:
        """Bytes of the first chunk that may pass before a ``stall-body`` cut (all if none)."""
        data = pipe.chunks[0][1]
        if pipe.down and self._mode is ProxyMode.STALL_BODY:
            return conn.answer.sendable(data)
        return len(data)

    def _ready_at(self, conn: _Conn, pipe: _Pipe, now: float) -> float | None:
        """When ``pipe`` (flowing) may send next; ``None``: nothing to send, or held at a cut."""
        if not pipe.chunks or self._stalled_at_cut(conn, pipe):
            return None
        due = pipe.chunks[0][0]
        bucket = self._bucket(pipe)
        if bucket is None:
            return due
        # Wait for a whole slice (or the whole chunk, if smaller): pieces, not
        # a trickle of tiny sends.
        need = min(self._sendable(conn, pipe), LinkShape.slice_bytes(bucket.rate))
        ready = bucket.ready_at(need, now)
        span = self._shape.slow_start_s
        if span and now - conn.connected_at < span:
            target = pipe.sent + need - _SLACK - LinkShape.slice_bytes(bucket.rate)
            ramp_age = min(span, _ramp_age(target, bucket.rate, span))
            ready = max(ready, conn.connected_at + ramp_age)
        return max(due, ready)

    def _flush_due(self) -> None:
        if self._mode not in _UP_FLOWS or not self._conns:
            return
        now = time.monotonic()
        conns = list(self._conns)
        # The caps are shared: take turns at being served first.
        self._turn = (self._turn + 1) % len(conns)
        for conn in conns[self._turn :] + conns[: self._turn]:
            if conn not in self._conns:
                continue
            for pipe, flowing in zip((conn.up, conn.down), self._flows(conn), strict=True):
                if flowing and not pipe.blocked:
                    ready = self._ready_at(conn, pipe, now)
                    if ready is not None and ready <= now:
                        self._pump(conn)
                        break

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
        """Send ``pipe``'s due bytes as far as cut, caps and ``dst`` allow; False if closed."""
        now = time.monotonic()
        bucket = self._bucket(pipe)
        while pipe.chunks and pipe.chunks[0][0] <= now:
            due, data = pipe.chunks[0]
            limit = self._sendable(conn, pipe)
            if not limit:
                self._stalled_at_cut(conn, pipe)
                return True
            if bucket is not None:
                piece = LinkShape.slice_bytes(bucket.rate)
                need = min(limit, piece)
                allowed = int(self._allowance(conn, pipe, now) + 0.5)
                if allowed < need:
                    return True  # a timer (see _timeout) brings the next slice
                # One slice per turn: the connections sharing the cap take
                # turns (_flush_due), none takes the whole burst.
                limit = min(limit, allowed, piece)
            try:
                sent = dst.send(data[:limit])
            except (BlockingIOError, InterruptedError):
                pipe.blocked = True
                return True
            except OSError:
                self._close(conn, reset=True)
                return False
            if pipe.down:
                conn.answer.sent(data[:sent])
                self._bytes_down += sent
            else:
                self._bytes_up += sent
            pipe.buffered -= sent
            pipe.sent += sent
            if bucket is not None:
                bucket.take(sent, now)
            if sent < len(data):
                pipe.chunks[0] = (due, data[sent:])
                if sent < limit:
                    pipe.blocked = True  # dst is full
                    return True
            else:
                pipe.chunks.popleft()
            if bucket is not None:
                return True  # a slice was sent: the next turn is another's
        return True

    def _update(self, conn: _Conn) -> None:
        sel = self._selector
        if sel is None:
            return  # not started (a shape set by the constructor)
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
                if not inbound.eof and inbound.buffered < self._queue_limit(inbound):
                    events |= selectors.EVENT_READ
                if flowing:
                    ready = self._ready_at(conn, outbound, now)
                    if ready is not None and (outbound.blocked or ready <= now):
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
        self._conns.pop(conn, None)
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
    parser.add_argument(
        "--shape",
        default="off",
        help="the link's shape at start, as in the shape command (e.g. 'up=1e6 latency=0.1')",
    )
    args = parser.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    try:
        shape = LinkShape.parse(args.shape.split())
    except ValueError as exc:
        parser.error(str(exc))
    with TcpProxy(host or "127.0.0.1", int(port), port=args.port, shape=shape) as proxy:
        print(proxy.port, flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] in ("quit", "exit"):
                break
            if words[0] == "shape":
                try:
                    proxy.set_shape(LinkShape.parse(words[1:]))
                except ValueError as exc:
                    print(f"error {exc}", flush=True)
                    continue
                print(f"ok shape {proxy.shape.describe()}", flush=True)
                continue
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
