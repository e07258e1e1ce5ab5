"""The MQTT bridge's services, run by the gateway: :class:`MqttIngest`, :class:`MqttPublisher`.

Integration with trio: each service runs one paho-mqtt ``Client`` with its
own network thread (``loop_start``), and an ingest hands messages to trio
through a bounded :class:`~edge_gateway.mqtt._handoff.Handoff`. Why a thread
and not paho's socket callbacks driven by
``trio.wait_readable``: paho's ``loop_read``/``loop_write``/``loop_misc``
interface wants the caller to track its socket's registration changes and
its keepalive timer, and its reconnect logic lives in ``loop_forever``; the
thread keeps all of that inside paho, and the bounded hand-off is the
backpressure: when the journal refuses (full disk, journal budget, shutdown),
the trio side stops taking, the hand-off fills, paho's thread blocks in
``on_message`` and stops reading the socket, and the broker queues for our
persistent session. Nothing is acknowledged and nothing is dropped.

Ingest acks: ``Client(manual_ack=True)``; a batch of messages is journaled
with one ``Gateway.produce`` (which returns once the append is durable), then
each message is PUBACKed, in the order received. A PUBACK goes only on the
connection its message came on (:class:`_Connections`): messages received on
an earlier connection are not acked on a later one (the broker redelivers them
with the DUP flag): they are journaled twice (docs/mqtt.md, "Duplicates").
"""

from __future__ import annotations

import functools
import logging
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from edge_gateway.backoff import Backoff
from edge_gateway.config import MqttIngestConfig, MqttPublishConfig, _MqttBroker
from edge_gateway.errors import ConfigError, InvalidInput, Unavailable, UnknownTopic
from edge_gateway.failpoints import fail_point
from edge_gateway.format.mqtt_topics import filter_matches, render_topic
from edge_gateway.mqtt._handoff import Handoff

if TYPE_CHECKING:
    import paho.mqtt.client as paho_client

    from edge_gateway.gateway import Gateway

__all__ = [
    "FilterStats",
    "IngestStats",
    "MqttIngest",
    "MqttPublisher",
    "PublishStats",
    "attach",
    "require_paho",
]

log = logging.getLogger("edgegw.mqtt")

#: The record header that holds the MQTT topic name when it is not the key.
TOPIC_HEADER = "mqtt-topic"
#: Set (``1``) on a message the broker redelivered (DUP flag): maybe a duplicate.
DUP_HEADER = "mqtt-dup"
#: Set (``1``) on a retained message (delivered because it was retained).
RETAIN_HEADER = "mqtt-retain"
#: Bytes journaled in one append at most (well under a journal entry's limit).
MAX_BATCH_BYTES = 8 << 20
#: Seconds one publish round waits for its PUBACKs before it reconnects.
PUBACK_TIMEOUT_S = 30.0


def require_paho() -> None:
    """Raise :class:`ConfigError` naming the extra when paho-mqtt is not installed."""
    try:
        import paho.mqtt.client  # noqa: F401
    except ImportError:
        raise ConfigError(
            "mqtt: [[mqtt.ingest]] or [[mqtt.publish]] is configured but paho-mqtt is not "
            "installed: install the mqtt extra (pip install 'edgegw[mqtt]')"
        ) from None


def _client(
    cfg: _MqttBroker, client_id: str, where: str, *, manual_ack: bool
) -> paho_client.Client:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=mqtt.MQTTv5,
        manual_ack=manual_ack,
    )
    password = cfg.password(where)
    if cfg.username:
        client.username_pw_set(cfg.username, password)
    if cfg.uses_tls:
        ctx = ssl.create_default_context(cafile=cfg.ca_file or None)
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        client.tls_set_context(ctx)
    client.reconnect_delay_set(1, 10)
    return client


def _connect_error(cfg: _MqttBroker, exc: BaseException) -> Unavailable:
    return Unavailable(f"cannot connect to the MQTT broker {cfg.describe()}: {exc}")


async def _connect(
    client: paho_client.Client, cfg: _MqttBroker, *, persistent: bool, receive_max: int = 0
) -> None:
    """Open the connection (a bad address or refused port raises here, clearly)."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    if persistent:
        # The session (subscriptions, unacked messages, what arrives while
        # we are away) outlives the connection: never expires.
        props.SessionExpiryInterval = 0xFFFFFFFF
    if receive_max:
        props.ReceiveMaximum = receive_max

    def connect() -> None:
        client.connect(
            cfg.host,
            cfg.port,
            keepalive=cfg.keepalive_s,
            clean_start=not persistent,
            properties=props,
        )

    try:
        await trio.to_thread.run_sync(connect, abandon_on_cancel=True)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise _connect_error(cfg, exc) from exc


async def _connect_retrying(
    client: paho_client.Client,
    cfg: _MqttBroker,
    report: Callable[[str], None],
    *,
    persistent: bool,
    receive_max: int = 0,
) -> None:
    """:func:`_connect` until it works: a broker away is expected, not a task failure.

    Each new reason is reported once (``report`` logs it and shows it in
    status); the attempts back off from 1 s to 30 s with full jitter (the
    report names the ceiling, not the draw, so it changes only as that grows).
    """
    backoff = Backoff(1.0, 30.0)
    while True:
        try:
            await _connect(client, cfg, persistent=persistent, receive_max=receive_max)
        except Unavailable as exc:
            report(f"{exc} (retrying in {backoff.ceiling_s:.0f} s at most)")
        else:
            return
        await trio.sleep(backoff.next_delay())


async def _stop(client: paho_client.Client) -> None:
    def stop() -> None:
        try:
            client.disconnect()
        finally:
            client.loop_stop()

    with trio.CancelScope(shield=True), trio.move_on_after(10):
        await trio.to_thread.run_sync(stop)


def _refusal(reason: Any) -> str:
    text = str(reason)
    hint = ""
    if text in ("Bad user name or password", "Not authorized"):
        hint = " (check username and password_file / password_env, or the broker's ACL)"
    return f"the broker refused the connection: {text}{hint}"


@dataclass(slots=True)
class FilterStats:
    """One subscribed filter of an ingest."""

    filter: str
    messages: int = 0
    #: Wall-clock ms of the last message it matched (0: none yet).
    last_ms: int = 0
    #: True while it got nothing for ``idle_warning_s`` (warned once per idle spell).
    idle: bool = False


@dataclass(slots=True)
class IngestStats:
    """What ``edgegw status`` and ``/metrics`` show of one ``[[mqtt.ingest]]``."""

    name: str
    broker: str
    topic: str
    client_id: str
    connected: bool = False
    #: connecting, connected, disconnected, blocked (the journal refuses; not reading)
    state: str = "connecting"
    messages_in: int = 0
    #: Messages journaled and PUBACKed.
    acked: int = 0
    #: Messages the broker redelivered (DUP flag): they may be in the journal twice.
    redeliveries: int = 0
    retained: int = 0
    bytes_in: int = 0
    batches: int = 0
    connects: int = 0
    #: Why the journal refuses now (None: it takes messages).
    blocked: str | None = None
    last_error: str | None = None
    filters: list[FilterStats] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "broker": self.broker,
            "topic": self.topic,
            "client_id": self.client_id,
            "state": self.state,
            "connected": self.connected,
            "messages_in": self.messages_in,
            "acked": self.acked,
            "redeliveries": self.redeliveries,
            "retained": self.retained,
            "bytes_in": self.bytes_in,
            "batches": self.batches,
            "connects": self.connects,
            "blocked": self.blocked,
            "last_error": self.last_error,
            "filters": [
                {"filter": f.filter, "messages": f.messages, "last_ms": f.last_ms, "idle": f.idle}
                for f in self.filters
            ],
        }


@dataclass(slots=True)
class _Message:
    mid: int
    topic: str
    payload: bytes
    dup: bool
    retain: bool
    properties: list[tuple[str, str]]
    #: The identity of the connection it arrived on (acks go only to that connection).
    connection: int


class _Connections:
    """Which of a paho client's connections is open: what messages are stamped
    with, and the gate their PUBACKs pass.

    A PUBACK means something only on the connection its PUBLISH came on: a
    broker that kept the session redelivers an unacknowledged message on the
    next connection anyway, and one that lost the session may give its packet
    id to another message there, which a stale PUBACK would acknowledge
    unjournaled. So each connection gets an identity, and a message is acked
    only while the connection it came on is still the open one.

    Invariants. The identity is assigned on paho's thread in ``on_connect``
    (:meth:`opened`), which paho runs on reading CONNACK, before it reads any
    PUBLISH of that connection — a queued session's messages follow CONNACK at
    once, so an identity assigned later (say, by trio once it gets round to it)
    would stamp them with the previous one, and they would never be acked. It
    is withdrawn (:meth:`closed`) in ``on_disconnect`` and in
    ``on_pre_connect``, which paho runs before it opens the next socket, under
    the lock the ack path holds (:meth:`holding`) while it queues PUBACKs: no
    PUBACK of one connection is queued once the next one may exist.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest = 0
        self._open: int | None = None

    def opened(self) -> int:
        """A connection is established (paho's thread, ``on_connect``): its new identity."""
        with self._lock:
            self._latest += 1
            self._open = self._latest
            return self._latest

    def closed(self) -> None:
        """The open connection is gone, or another is about to be opened (paho's thread)."""
        with self._lock:
            self._open = None

    @property
    def latest(self) -> int:
        """The last connection established: the one paho's thread reads messages from now.

        Read on paho's thread only (``on_message``), which alone writes it.
        """
        return self._latest

    @contextmanager
    def holding(self) -> Iterator[int | None]:
        """The open connection's identity (None: none), kept current while held."""
        with self._lock:
            yield self._open


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class MqttIngest:
    """One ``[[mqtt.ingest]]``: subscribe at QoS 1, journal, then PUBACK."""

    def __init__(self, gateway: Gateway, cfg: MqttIngestConfig) -> None:
        self.gateway = gateway
        self.cfg = cfg
        self.client_id = cfg.client_id or f"edgegw-{gateway.region}-{cfg.bridge_name}"
        self._stats = IngestStats(
            cfg.bridge_name,
            cfg.describe(),
            cfg.topic,
            self.client_id,
            filters=[FilterStats(f) for f in cfg.filters],
        )
        self._subscribed_at = time.monotonic()

    @property
    def name(self) -> str:
        return self.cfg.bridge_name

    def statistics(self) -> IngestStats:
        return self._stats

    def _where(self) -> str:
        return f"mqtt.ingest[{self.name}]"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, subscribe, and journal what arrives until cancelled."""
        cfg, st = self.cfg, self._stats
        token = trio.lowlevel.current_trio_token()
        handoff = Handoff[_Message](cfg.max_inflight, token)
        connections = _Connections()
        client = _client(cfg, self.client_id, self._where(), manual_ack=True)
        self._install_callbacks(client, token, handoff, connections)
        st.state = "connecting"
        # Started before connecting: a broker away at start is retried by
        # the supervisor, the gateway serves meanwhile.
        task_status.started()
        await _connect_retrying(
            client, cfg, self._error, persistent=True, receive_max=cfg.max_inflight
        )
        client.loop_start()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_idle)
                await self._consume(client, handoff, connections)
        finally:
            # Releases paho's thread if it waits for room: what it holds is
            # not acknowledged, and the broker redelivers it.
            handoff.close()
            st.connected = False
            st.state = "disconnected"
            await _stop(client)

    def _error(self, message: str) -> None:
        if message != self._stats.last_error:
            log.error("%s: %s", self._where(), message)
        self._stats.last_error = message

    def _install_callbacks(
        self,
        client: paho_client.Client,
        token: trio.lowlevel.TrioToken,
        handoff: Handoff[_Message],
        connections: _Connections,
    ) -> None:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties
        from paho.mqtt.subscribeoptions import SubscribeOptions

        st, cfg = self._stats, self.cfg

        # These run on paho's thread: they never raise (an exception would
        # end paho's loop) and reach trio's state only through ``token``.
        def on_connect(
            client: paho_client.Client, _u: Any, _flags: Any, reason: Any, _p: Any
        ) -> None:
            if reason.is_failure:
                token.run_sync_soon(self._error, _refusal(reason))
                return
            # Here, not in connected(): the PUBLISHes that follow CONNACK are
            # read on this thread right after this returns (_Connections).
            connections.opened()

            def connected() -> None:
                st.connects += 1
                st.connected = True
                st.state = "connected" if st.blocked is None else "blocked"
                st.last_error = None
                self._subscribed_at = time.monotonic()
                log.info("%s: connected to %s as %s", self._where(), cfg.describe(), self.client_id)

            token.run_sync_soon(connected)
            # Retained messages are sent only when a subscription is new
            # (retain handling 1): once, not at every reconnect (docs/mqtt.md).
            opts = SubscribeOptions(qos=1, retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB)
            client.subscribe(
                [(f, opts) for f in cfg.filters],
                properties=Properties(PacketTypes.SUBSCRIBE),  # type: ignore[no-untyped-call]
            )

        def on_connect_fail(_c: paho_client.Client, _u: Any) -> None:
            token.run_sync_soon(
                self._error, f"cannot reconnect to the MQTT broker {cfg.describe()} (retrying)"
            )

        def on_pre_connect(_c: paho_client.Client, _u: Any) -> None:
            # Before paho opens a socket: no PUBACK of the last connection may
            # be queued behind the next CONNECT (on_disconnect has normally
            # closed it already).
            connections.closed()

        def on_disconnect(_c: paho_client.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
            connections.closed()

            def gone() -> None:
                if st.connected:
                    log.warning(
                        "%s: disconnected from %s (%s); reconnecting",
                        self._where(),
                        cfg.describe(),
                        reason,
                    )
                st.connected = False
                st.state = "disconnected"

            token.run_sync_soon(gone)

        def on_subscribe(_c: paho_client.Client, _u: Any, _mid: int, codes: Any, _p: Any) -> None:
            bad = [f"{f}: {c}" for f, c in zip(cfg.filters, codes, strict=False) if c.is_failure]
            if bad:
                token.run_sync_soon(self._error, f"the broker refused filters: {', '.join(bad)}")

        def on_message(_c: paho_client.Client, _u: Any, msg: paho_client.MQTTMessage) -> None:
            props = getattr(msg.properties, "UserProperty", None) or []
            item = _Message(
                msg.mid,
                msg.topic,
                bytes(msg.payload),
                bool(msg.dup),
                bool(msg.retain),
                list(props),
                connections.latest,
            )
            try:
                # Blocks paho's thread while max_inflight messages wait: it
                # stops reading the socket, and the broker holds the rest.
                # False: stopping; not acked, the broker redelivers it.
                handoff.put(item)
            except BaseException as exc:  # noqa: BLE001 - never let paho's loop die
                log.debug("%s: hand-off failed: %r", self._where(), exc)

        client.on_connect = on_connect
        client.on_connect_fail = on_connect_fail
        client.on_pre_connect = on_pre_connect
        client.on_disconnect = on_disconnect
        client.on_subscribe = on_subscribe
        client.on_message = on_message

    def _record(self, m: _Message) -> Any:
        from edge_gateway.gateway import ProduceRecord

        headers: list[tuple[str, bytes]] = [(k, v.encode()) for k, v in m.properties]
        if self.cfg.key_from == "topic":
            key: bytes | None = m.topic.encode()
        else:
            key = next((v.encode() for k, v in m.properties if k == self.cfg.key_from), None)
            headers.append((TOPIC_HEADER, m.topic.encode()))
        if m.dup:
            headers.append((DUP_HEADER, b"1"))
        if m.retain:
            headers.append((RETAIN_HEADER, b"1"))
        return ProduceRecord(value=m.payload, key=key, headers=tuple(headers))

    async def _consume(
        self, client: paho_client.Client, handoff: Handoff[_Message], connections: _Connections
    ) -> None:
        cfg, st = self.cfg, self._stats
        # A batch's entry must fit the journal's budget and a segment with
        # room to spare, or a full journal could never take it.
        j = self.gateway.config.journal
        limit = min(MAX_BATCH_BYTES, j.segment_bytes // 4, j.max_bytes // 8)
        while True:
            batch = await handoff.get_batch(cfg.max_batch, lambda m: len(m.payload) + 64, limit)
            now = _now_ms()
            for m in batch:
                st.messages_in += 1
                st.bytes_in += len(m.payload)
                st.redeliveries += m.dup
                st.retained += m.retain
                for f in st.filters:
                    if filter_matches(f.filter, m.topic):
                        f.messages += 1
                        f.last_ms = now
                        if f.idle:
                            f.idle = False
                            log.info("%s: filter %s gets messages again", self._where(), f.filter)
            await self._journal([self._record(m) for m in batch])
            fail_point("mqtt.before_ack")
            stale = 0
            # Held while the PUBACKs are queued: paho cannot move on to another
            # connection meanwhile (_Connections). The others' messages are
            # redelivered by the broker, marked DUP.
            with connections.holding() as current:
                for m in batch:
                    if m.connection == current:
                        client.ack(m.mid, 1)
                        st.acked += 1
                    else:
                        stale += 1
            if stale:
                log.debug(
                    "%s: %d messages of a closed connection journaled, not acked "
                    "(the broker redelivers them)",
                    self._where(),
                    stale,
                )
            st.batches += 1

    async def _journal(self, records: list[Any]) -> None:
        """Append durably, retrying while the journal refuses (never dropping).

        One entry per partition, all written before one wait for durability;
        when the journal refuses part way, the partitions written stay
        written and only the rest is retried (nothing is journaled twice).
        """
        st, gw, topic = self._stats, self.gateway, self.cfg.topic
        backoff = Backoff(0.1, 5.0)
        groups: list[tuple[int, list[Any]]] | None = None
        while True:
            try:
                if groups is None:
                    groups = gw.group_by_partition(topic, records)
                groups = groups[await gw.append_groups(topic, groups) :]
            except (UnknownTopic, InvalidInput) as exc:
                # Not something a retry fixes quickly, but dropping is not an
                # option: hold the messages (unacked) and say why, loudly.
                self._block(f"the gateway refuses the messages: {exc}", error=True)
            except Unavailable as exc:
                self._block(f"the journal refuses: {exc}", error=False)
            else:
                if not groups:
                    if st.blocked is not None:
                        log.info("%s: the journal takes messages again", self._where())
                        st.blocked = None
                        st.state = "connected" if st.connected else "disconnected"
                    return
                self._block("the journal refuses: it took part of a batch only", error=False)
            await trio.sleep(backoff.next_delay())

    def _block(self, reason: str, *, error: bool) -> None:
        st = self._stats
        if st.blocked != reason:
            (log.error if error else log.warning)(
                "%s: not reading from the broker (it queues): %s", self._where(), reason
            )
        st.blocked = reason
        st.state = "blocked"

    async def _watch_idle(self) -> None:
        """Warn once per spell when a filter gets nothing for ``idle_warning_s``."""
        limit = self.cfg.idle_warning_s
        while True:
            await trio.sleep(min(limit / 4, 5.0))
            st = self._stats
            if not st.connected or st.blocked is not None:
                continue  # not reading now: silence says nothing of the filters
            now_mono, now = time.monotonic(), _now_ms()
            for f in st.filters:
                quiet_since = max(self._subscribed_at, now_mono - (now - f.last_ms) / 1000)
                if f.last_ms == 0:
                    quiet_since = self._subscribed_at
                if not f.idle and now_mono - quiet_since >= limit:
                    f.idle = True
                    log.warning(
                        "%s: filter %s matched no message for %.0f s (a typo in the filter, "
                        "or the devices are quiet?)",
                        self._where(),
                        f.filter,
                        limit,
                    )


@dataclass(slots=True)
class PublishStats:
    """What ``edgegw status`` and ``/metrics`` show of one ``[[mqtt.publish]]``."""

    name: str
    broker: str
    group: str
    client_id: str
    topics: tuple[str, ...]
    connected: bool = False
    state: str = "connecting"
    messages_out: int = 0
    bytes_out: int = 0
    connects: int = 0
    last_error: str | None = None
    #: (topic, partition) -> next offset to publish (committed progress).
    positions: dict[tuple[str, int], int] = field(default_factory=dict)

    def lag(self, gateway: Gateway) -> int:
        """Records in the journal not published yet (over all partitions)."""
        total = 0
        for (topic, partition), offset in self.positions.items():
            try:
                total += max(0, gateway.lanes.next_offset(topic, partition) - offset)
            except Exception:  # noqa: BLE001 - the gateway is stopping: no lag to show
                return 0
        return total

    def to_json(self, gateway: Gateway) -> dict[str, Any]:
        return {
            "name": self.name,
            "broker": self.broker,
            "group": self.group,
            "client_id": self.client_id,
            "topics": list(self.topics),
            "state": self.state,
            "connected": self.connected,
            "messages_out": self.messages_out,
            "bytes_out": self.bytes_out,
            "connects": self.connects,
            "lag_records": self.lag(gateway),
            "last_error": self.last_error,
        }


class MqttPublisher:
    """One ``[[mqtt.publish]]``: publish topics into the broker, progress in a consumer group."""

    def __init__(self, gateway: Gateway, cfg: MqttPublishConfig) -> None:
        self.gateway = gateway
        self.cfg = cfg
        self.client_id = cfg.client_id or f"edgegw-{gateway.region}-pub-{cfg.name}"
        self._stats = PublishStats(
            cfg.name, cfg.describe(), cfg.group_name, self.client_id, cfg.topics
        )
        self._connected = trio.Event()

    @property
    def name(self) -> str:
        return self.cfg.name

    def statistics(self) -> PublishStats:
        return self._stats

    def _where(self) -> str:
        return f"mqtt.publish[{self.name}]"

    def _error(self, message: str) -> None:
        if message != self._stats.last_error:
            log.error("%s: %s", self._where(), message)
        self._stats.last_error = message

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        cfg, st = self.cfg, self._stats
        token = trio.lowlevel.current_trio_token()
        self._connected = trio.Event()
        client = _client(cfg, self.client_id, self._where(), manual_ack=False)
        client.max_inflight_messages_set(cfg.max_inflight)
        client.max_queued_messages_set(0)
        self._install_callbacks(client, token)
        st.state = "connecting"
        task_status.started()
        await _connect_retrying(client, cfg, self._error, persistent=False)
        client.loop_start()
        try:
            async with trio.open_nursery() as nursery:
                for topic in cfg.topics:
                    info = self.gateway.describe_topic(topic)
                    committed = {
                        c.partition: c.offset
                        for c in await self.gateway.fetch_offsets(cfg.group_name, topic)
                    }
                    for p in range(info.partitions):
                        start = committed.get(p, info.first_offsets[p])
                        st.positions[(topic, p)] = start
                        nursery.start_soon(self._pump, client, info.name, info.home, p)
        finally:
            st.connected = False
            st.state = "disconnected"
            await _stop(client)

    def _install_callbacks(
        self, client: paho_client.Client, token: trio.lowlevel.TrioToken
    ) -> None:
        st, cfg = self._stats, self.cfg

        def on_connect(_c: paho_client.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
            if reason.is_failure:
                token.run_sync_soon(self._error, _refusal(reason))
                return

            def connected() -> None:
                st.connected = True
                st.connects += 1
                st.state = "connected"
                st.last_error = None
                self._connected.set()
                log.info("%s: connected to %s as %s", self._where(), cfg.describe(), self.client_id)

            token.run_sync_soon(connected)

        def on_disconnect(_c: paho_client.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
            def gone() -> None:
                if st.connected:
                    log.warning(
                        "%s: disconnected from %s (%s)", self._where(), cfg.describe(), reason
                    )
                st.connected = False
                st.state = "disconnected"
                # Replaced only once set: a waiter always holds the event
                # the next connect sets.
                if self._connected.is_set():
                    self._connected = trio.Event()

            token.run_sync_soon(gone)

        client.on_connect = on_connect
        client.on_disconnect = on_disconnect

    async def _pump(
        self, client: paho_client.Client, topic: str, home: str, partition: int
    ) -> None:
        """Publish one partition in offset order; commit progress after each round's PUBACKs."""
        gw, cfg, st = self.gateway, self.cfg, self._stats
        source_topic = gw.describe_topic(topic).source_topic
        key = (topic, partition)
        while True:
            offset = st.positions[key]
            res = await gw.fetch(topic, partition, offset, max_records=cfg.max_batch, wait_ms=1000)
            if not res.records:
                first = gw.lanes.first_offset(topic, partition) if res.high_watermark else 0
                if offset < first:
                    log.warning(
                        "%s: %s/%d offsets %d..%d are gone from the journal (retention) before "
                        "they were published: continuing at %d",
                        self._where(),
                        topic,
                        partition,
                        offset,
                        first - 1,
                        first,
                    )
                    st.positions[key] = first
                continue
            messages = [
                (
                    render_topic(
                        cfg.template,
                        region=home,
                        topic=source_topic,
                        key=r.key,
                        partition=partition,
                        offset=r.offset,
                    ),
                    # MQTT has no null: a null value (a Kafka tombstone) is an
                    # empty payload, a null header value an empty user property.
                    b"" if r.value is None else r.value,
                    [(k, b"" if v is None else v) for k, v in r.headers],
                )
                for r in res.records
            ]
            await self._connected.wait()
            try:
                await trio.to_thread.run_sync(self._publish_all, client, messages)
            except Unavailable as exc:
                # The connection broke mid-round: publish the round again
                # once reconnected (at least once: some went through).
                self._error(f"{exc}; publishing {topic}/{partition} again from {offset}")
                await trio.sleep(1.0)
                continue
            await gw.commit_offsets(cfg.group_name, [(topic, partition, res.next_offset, "")])
            st.positions[key] = res.next_offset
            st.messages_out += len(messages)
            st.bytes_out += sum(len(v) for _, v, _ in messages)

    def _publish_all(
        self, client: paho_client.Client, messages: list[tuple[str, bytes, list[tuple[str, bytes]]]]
    ) -> None:
        """Publish at QoS 1 and wait for every PUBACK (on a worker thread)."""
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        infos = []
        for topic, value, headers in messages:
            props = None
            if headers:
                props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
                props.UserProperty = [(k, v.decode("utf-8", "replace")) for k, v in headers]
            infos.append(
                client.publish(topic, value, qos=1, retain=self.cfg.retain, properties=props)
            )
        deadline = time.monotonic() + PUBACK_TIMEOUT_S
        for info in infos:
            try:
                info.wait_for_publish(max(0.0, deadline - time.monotonic()))
            except (RuntimeError, ValueError) as exc:
                raise Unavailable(
                    f"publishing to the MQTT broker {self.cfg.describe()} failed: {exc}"
                ) from exc
            if not info.is_published():
                raise Unavailable(
                    f"the MQTT broker {self.cfg.describe()} did not acknowledge a publish "
                    f"within {PUBACK_TIMEOUT_S:.0f} s"
                )


def attach(gateway: Gateway) -> None:
    """Attach the configured bridges to ``gateway`` (what ``edgegw serve`` does).

    Raises :class:`ConfigError` at once when paho-mqtt is missing. Each bridge
    runs as a supervised service once the gateway accepts produce; the
    ``mqtt`` block of its status reports the bridges started.
    """
    require_paho()
    bridges: list[tuple[str, MqttIngest | MqttPublisher]] = []
    for ing in gateway.config.mqtt.ingest:
        ingest = MqttIngest(gateway, ing)
        bridges.append((f"mqtt ingest {ingest.name}", ingest))
    for pub in gateway.config.mqtt.publish:
        publisher = MqttPublisher(gateway, pub)
        bridges.append((f"mqtt publish {publisher.name}", publisher))
    started: list[MqttIngest | MqttPublisher] = []
    for name, bridge in bridges:
        run = functools.partial(_run_bridge, started, bridge)
        gateway.add_service(name, run, once_accepting=True)
    gateway.add_status("mqtt", functools.partial(_status_json, gateway, started))


async def _run_bridge(
    started: list[MqttIngest | MqttPublisher],
    bridge: MqttIngest | MqttPublisher,
    gateway: Gateway,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    if bridge not in started:  # the supervisor restarts it: counted once
        started.append(bridge)
    await bridge.run(task_status=task_status)


def _status_json(
    gateway: Gateway, started: list[MqttIngest | MqttPublisher]
) -> dict[str, Any] | None:
    """The ``mqtt`` block of the gateway's status (None: no bridge started)."""
    if not started:
        return None
    return {
        "ingest": [b.statistics().to_json() for b in started if isinstance(b, MqttIngest)],
        "publish": [
            b.statistics().to_json(gateway) for b in started if isinstance(b, MqttPublisher)
        ],
    }
