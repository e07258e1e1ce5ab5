"""The gateway's configuration: one TOML file, validated at start.

Every key, its default and its meaning is listed in ``docs/configuration.md``;
``edgegw init`` writes a commented starter file. Loading is strict: an unknown
key, a wrong type or an out-of-range value raises :class:`ConfigError` naming
the key (``journal.fsync: 'sometimes' is not one of ...``), before anything
touches the disk or the network.

Any key of a section can be overridden from the environment as
``EDGEGW_<SECTION>_<KEY>`` (``EDGEGW_BUCKET_SECRET_KEY``,
``EDGEGW_API_TOKEN``), top-level keys as ``EDGEGW_<KEY>``; that is the way to
pass secrets without writing them into the file.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import json
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from edge_gateway.bucket import AzureConfig, GcsConfig, LinkPolicy, S3Config, parse_window
from edge_gateway.clock import ClockConfig
from edge_gateway.encryption import EncryptionConfig, parse_encryption
from edge_gateway.errors import ConfigError, EdgeGatewayError, InvalidName
from edge_gateway.format.mqtt_topics import validate_filter, validate_template
from edge_gateway.journal import JournalConfig, OnFull, Priority
from edge_gateway.names import (
    mirror_topic,
    validate_group,
    validate_home_topic,
    validate_region,
    validate_topic,
)
from edge_gateway.net.http import KEEP_ALIVE_TIMEOUT_S, READ_TIMEOUT_S, ListenAddress
from edge_gateway.shipper import ShipperConfig

__all__ = [
    "ApiConfig",
    "BucketConfig",
    "ClockConfig",
    "IdempotenceConfig",
    "GatewayConfig",
    "GcSettings",
    "KafkaConfig",
    "LinkConfig",
    "LogConfig",
    "MetadataSettings",
    "MirrorConfig",
    "MqttConfig",
    "MqttIngestConfig",
    "MqttPublishConfig",
    "TopicConfig",
    "load_config",
    "parse_config",
]

ENV_PREFIX = "EDGEGW_"
DEFAULT_PORT = 8470
_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)?\s*$")
_UNITS = {
    None: 1,
    "B": 1,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "TiB": 1 << 40,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
}


@dataclass(frozen=True, slots=True)
class BucketConfig:
    """Where the shared bucket is: a local directory (the default), S3, Azure Blob or GCS."""

    #: ``local`` (a directory; the embedded default), ``s3``, ``azure`` or ``gcs``
    #: (docs/stores.md).
    type: Literal["local", "s3", "azure", "gcs"] = "local"
    #: Local bucket directory; default ``<data_dir>/bucket``.
    path: str = ""
    #: Every key under this prefix (both types).
    prefix: str = ""
    # --- s3 only (see docs/bucket.md) ---
    bucket: str = ""
    endpoint_url: str = ""
    region: str = ""
    path_style: bool = False
    access_key: str = ""
    secret_key: str = field(default="", repr=False)
    session_token: str = field(default="", repr=False)
    profile: str = ""
    connect_timeout: float = 5.0
    read_timeout: float = 10.0
    retry_mode: Literal["standard", "adaptive"] = "standard"
    max_attempts: int = 3
    max_concurrency: int = 16
    multipart_threshold: int = 16 << 20
    part_size: int = 8 << 20
    part_concurrency: int = 4
    #: GETs without botocore's per-call pipeline (docs/bucket.md, ``lean_get``).
    lean_get: bool = True
    # --- azure only (endpoint_url, prefix, timeouts, max_attempts, max_concurrency,
    # multipart_threshold and part_size apply too) ---
    container: str = ""
    connection_string: str = field(default="", repr=False)
    connection_string_file: str = ""
    account_key: str = field(default="", repr=False)
    # --- gcs only (bucket, endpoint_url, prefix, timeouts ... apply too) ---
    project: str = ""
    credentials_file: str = ""
    anonymous: bool = False

    def __post_init__(self) -> None:
        if self.type in ("s3", "gcs") and not self.bucket:
            raise ConfigError(f"bucket.bucket: required when bucket.type = {self.type!r}")
        if self.type == "azure" and not self.container:
            raise ConfigError("bucket.container: required when bucket.type = 'azure'")
        # Check the store's own rules at load time, not at the first request.
        if self.type == "azure":
            self.azure_config()
        elif self.type == "gcs":
            self.gcs_config()

    def cloud_config(self) -> S3Config | AzureConfig | GcsConfig:
        """The config of the cloud store ``type`` names (not for ``local``)."""
        if self.type == "azure":
            return self.azure_config()
        if self.type == "gcs":
            return self.gcs_config()
        return self.s3_config()

    def azure_config(self) -> AzureConfig:
        """The ``[bucket]`` of an Azure Blob container (``type = "azure"``)."""

        def opt(value: str) -> str | None:
            return value or None

        return AzureConfig(
            container=self.container,
            prefix=self.prefix,
            endpoint_url=opt(self.endpoint_url),
            connection_string=opt(self.connection_string),
            connection_string_file=opt(self.connection_string_file),
            account_key=opt(self.account_key),
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            max_attempts=self.max_attempts,
            max_concurrency=self.max_concurrency,
            max_single_put_size=self.multipart_threshold,
            block_size=self.part_size,
        )

    def gcs_config(self) -> GcsConfig:
        """The ``[bucket]`` of a Google Cloud Storage bucket (``type = "gcs"``)."""

        def opt(value: str) -> str | None:
            return value or None

        return GcsConfig(
            bucket=self.bucket,
            prefix=self.prefix,
            endpoint_url=opt(self.endpoint_url),
            project=opt(self.project),
            credentials_file=opt(self.credentials_file),
            anonymous=self.anonymous,
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            max_attempts=self.max_attempts,
            max_concurrency=self.max_concurrency,
        )

    def s3_config(self) -> S3Config:
        def opt(value: str) -> str | None:
            return value or None

        return S3Config(
            bucket=self.bucket,
            prefix=self.prefix,
            endpoint_url=opt(self.endpoint_url),
            region=opt(self.region),
            path_style=self.path_style,
            access_key=opt(self.access_key),
            secret_key=opt(self.secret_key),
            session_token=opt(self.session_token),
            profile=opt(self.profile),
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            retry_mode=self.retry_mode,
            max_attempts=self.max_attempts,
            max_concurrency=self.max_concurrency,
            multipart_threshold=self.multipart_threshold,
            part_size=self.part_size,
            part_concurrency=self.part_concurrency,
            lean_get=self.lean_get,
        )

    def describe(self, data_dir: Path) -> str:
        if self.type == "local":
            return f"local directory {self.local_path(data_dir)}"
        if self.type == "azure":
            where = self.endpoint_url or "the connection string's account"
            return f"azure container {self.container}/{self.prefix} at {where}"
        if self.type == "gcs":
            return f"gs://{self.bucket}/{self.prefix} at {self.endpoint_url or 'Google'}"
        where = self.endpoint_url or "AWS"
        return f"s3://{self.bucket}/{self.prefix} at {where}"

    def local_path(self, data_dir: Path) -> Path:
        return Path(self.path) if self.path else data_dir / "bucket"


@dataclass(frozen=True, slots=True)
class LinkConfig:
    """``[link]``: the site's link to the bucket (``edge_gateway.bucket.LinkMeter``)."""

    #: Cap on object bytes moved to and from the bucket per second, uploads
    #: and downloads together (``"4MB"``, ``"512KiB"``); 0: no cap.
    max_bytes_per_s: int = 0
    #: Local times of day when ``bulk`` data may ship (``"22:00-06:00"``; a
    #: window may wrap midnight); empty: at any time.
    bulk_windows: tuple[str, ...] = ()
    #: Bytes the link may carry per local day / month (uploads and downloads
    #: together, as the meter counts them); past it only critical data moves. 0: none.
    daily_bytes: int = 0
    monthly_bytes: int = 0

    def __post_init__(self) -> None:
        if self.max_bytes_per_s < 0:
            raise ConfigError("link.max_bytes_per_s must be >= 0 (0: no cap)")
        if 0 < self.max_bytes_per_s < 1024:
            raise ConfigError("link.max_bytes_per_s must be at least 1KiB/s (or 0: no cap)")
        for i, text in enumerate(self.bulk_windows):
            parse_window(text, f"link.bulk_windows[{i}]")
        for key in ("daily_bytes", "monthly_bytes"):
            value = getattr(self, key)
            if value < 0:
                raise ConfigError(f"link.{key} must be >= 0 (0: no allowance)")
            if 0 < value < 1 << 20:
                raise ConfigError(
                    f"link.{key} must be at least 1MiB (or 0: no allowance); "
                    'sizes like "2GiB" are accepted'
                )
        if self.daily_bytes and self.monthly_bytes and self.daily_bytes > self.monthly_bytes:
            raise ConfigError("link.daily_bytes must not exceed link.monthly_bytes")

    def policy(self) -> LinkPolicy:
        """The rule these settings make (local time of this machine)."""
        return LinkPolicy(
            [parse_window(w) for w in self.bulk_windows],
            daily_bytes=self.daily_bytes,
            monthly_bytes=self.monthly_bytes,
        )


@dataclass(frozen=True, slots=True)
class ApiConfig(ListenAddress):
    """The local produce/consume API (and ``/metrics``)."""

    #: ``host:port``; port 0 picks a free one (written to ``<data_dir>/api.addr``).
    listen: str = f"127.0.0.1:{DEFAULT_PORT}"
    #: Bearer token clients must send; required when ``listen`` is not loopback.
    token: str = field(default="", repr=False)
    #: Largest request body accepted (413 above).
    max_body_bytes: int = 16 << 20
    #: Upper bound on a fetch's long-poll ``wait_ms``.
    max_wait_ms: int = 60_000
    #: Serve ``/metrics`` without the token (Prometheus scrapers often have none).
    public_metrics: bool = True
    #: The HTTP server: ``builtin`` (default: edgegw's own HTTP/1.1 server, a fast
    #: path for plain requests and h11 for the rest) or ``hypercorn``; see
    #: docs/api.md "Choosing the server".
    server: Literal["hypercorn", "builtin"] = "builtin"
    #: Seconds a connection may wait for its next complete request head (idle
    #: keep-alive, or a head still arriving) before the server closes it.
    keep_alive_timeout_s: float = KEEP_ALIVE_TIMEOUT_S
    #: Seconds each read of a request body may wait for data (408 and close after).
    read_timeout_s: float = READ_TIMEOUT_S
    #: TLS: the server's certificate chain (PEM); with ``tls_key`` the API speaks
    #: only HTTPS. Relative paths are relative to the config file's folder.
    tls_cert: str = ""
    #: TLS: the certificate's private key (PEM, unencrypted).
    tls_key: str = ""
    #: TLS: CA bundle (PEM) of client certificates: set, every client must
    #: present a certificate it signed (mutual TLS).
    tls_client_ca: str = ""
    #: TLS: CA bundle (PEM) that clients on this machine (``edgegw status``,
    #: ``produce``, ... with ``--config``) verify the server with; empty: the
    #: certificate file itself (a self-signed certificate), else the system's.
    tls_ca: str = ""
    #: Seconds a new connection may take to complete its TLS handshake.
    tls_handshake_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        _check_listen(self.listen, "api.listen")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError(
                "api.tls_cert and api.tls_key: set both (the API serves HTTPS) or neither"
            )
        if self.tls_client_ca and not self.tls_cert:
            raise ConfigError(
                "api.tls_client_ca: needs api.tls_cert and api.tls_key (client "
                "certificates are checked only over TLS)"
            )
        if not self.is_loopback and not self.token:
            raise ConfigError(
                f"api.token: required when api.listen ({self.listen}) is not a loopback "
                "address (set it in the file or in EDGEGW_API_TOKEN)"
            )
        if self.max_body_bytes < 1024:
            raise ConfigError("api.max_body_bytes must be at least 1 KiB")
        if self.max_wait_ms < 0:
            raise ConfigError("api.max_wait_ms must be >= 0")
        for key in ("keep_alive_timeout_s", "read_timeout_s", "tls_handshake_timeout_s"):
            value = getattr(self, key)
            if not 0 < value < float("inf"):  # also refuses NaN
                raise ConfigError(f"api.{key} must be a number of seconds > 0, not {value!r}")

    @property
    def tls(self) -> bool:
        """True when the API serves HTTPS."""
        return bool(self.tls_cert)

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"


@dataclass(frozen=True, slots=True)
class KafkaConfig(ListenAddress):
    """``[kafka]``: the Kafka protocol listener (docs/kafka.md); off unless ``listen`` is set."""

    #: ``host:port`` of the Kafka listener (``127.0.0.1:9092``); empty: off. Port 0
    #: picks a free one (written to ``<data_dir>/kafka.addr``). It speaks TLS
    #: exactly when the HTTP API does (``api.tls_*``: same certificate, same
    #: client CA); when ``api.token`` is set, clients authenticate with SASL/PLAIN.
    listen: str = ""
    #: The host name and port Metadata answers clients to connect to; empty: the
    #: bound address (set it when clients reach the gateway through NAT or a name).
    advertised: str = ""
    #: Largest request frame accepted; a larger size prefix closes the connection
    #: before any of it is read.
    max_request_bytes: int = 16 << 20
    #: Largest Fetch response (all partitions); Kafka's ``fetch.max.bytes`` is
    #: honoured below this.
    max_fetch_bytes: int = 16 << 20
    #: Upper bound on a Fetch's ``max_wait_ms`` (long poll).
    max_wait_ms: int = 60_000
    #: Seconds a connection may stay idle (no request) before it is closed.
    idle_timeout_s: float = 600.0
    #: Open connections at most; more are closed at once.
    max_connections: int = 1024
    #: What ``acks=all`` waits for: ``local`` (in the journal, as ``acks=1``) or
    #: ``shipped`` (committed to the bucket, as the HTTP API's ``ack=shipped``).
    acks_all: Literal["local", "shipped"] = "local"

    def __post_init__(self) -> None:
        if self.listen:
            _check_listen(self.listen, "kafka.listen")
        if self.advertised:
            _check_listen(self.advertised, "kafka.advertised")
            if self.advertised.endswith(":0"):
                raise ConfigError("kafka.advertised: the port must be the one clients use, not 0")
        if not 1024 <= self.max_request_bytes <= 1 << 30:
            raise ConfigError("kafka.max_request_bytes must be 1 KiB..1 GiB")
        if not 1024 <= self.max_fetch_bytes <= 1 << 30:
            raise ConfigError("kafka.max_fetch_bytes must be 1 KiB..1 GiB")
        if self.max_wait_ms < 0:
            raise ConfigError("kafka.max_wait_ms must be >= 0")
        if not 0 < self.idle_timeout_s < float("inf"):
            raise ConfigError("kafka.idle_timeout_s must be a number of seconds > 0")
        if self.max_connections < 1:
            raise ConfigError("kafka.max_connections must be >= 1")

    @property
    def enabled(self) -> bool:
        return bool(self.listen)


# RFC 1123 labels, plus '_' (container runtimes' DNS resolves service names with it)
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


def _check_listen(listen: str, key: str) -> None:
    """Refuse a ``host:port`` that no socket could bind: what the syntax can tell.

    Whether the host resolves, or the address belongs to this machine, is only
    known at bind time (``edgegw serve`` names the key then too).
    """
    host, colon, port = listen.rpartition(":")
    example = "like 127.0.0.1:8470, 0.0.0.0:8470 or [::1]:8470"
    if not colon or not host:
        raise ConfigError(f"{key}: {listen!r} is not host:port ({example})")
    if not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ConfigError(f"{key}: {listen!r}: the port must be a number 0..65535")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ConfigError(f"{key}: {host[1:-1]!r} is not an IPv6 address") from None
    elif ":" in host:
        raise ConfigError(f"{key}: {listen!r}: an IPv6 address goes in brackets ({example})")
    elif re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ConfigError(f"{key}: {host!r} is not an IPv4 address") from None
    elif len(host) > 253 or not all(_HOST_LABEL.fullmatch(x) for x in host.split(".")):
        raise ConfigError(f"{key}: {host!r} is not a host name or IP address ({example})")


@dataclass(frozen=True, slots=True)
class MirrorConfig:
    """How this gateway tails other regions' logs."""

    #: Ask for the next log entry this often while data flows ...
    poll_interval_ms: int = 100
    #: ... backing off up to this when a source is idle.
    max_poll_interval_ms: int = 2_000
    #: When a source deleted data this region still needs: stop (``fail``) or
    #: jump to the earliest available entry and record the gap (``skip``).
    gap_policy: Literal["fail", "skip"] = "fail"
    #: Log objects fetched ahead while catching up.
    prefetch: int = 8
    #: Catching up, fetch the source's packs of small entries (one GET each)
    #: instead of each entry (``docs/mirroring.md``, "Packs").
    packs: bool = True
    #: Keep each fetched block as one journal block entry, as shipped (never
    #: decompressed; version 3 journal segments, ``docs/at-rest.md``); false:
    #: decompress it and append each batch (version 2 segments stay readable by
    #: a gateway from before block entries).
    keep_blocks: bool = True
    #: Publish ``regions/<src>/cursors/<region>.json`` this often.
    cursor_interval_ms: int = 10_000
    #: While the bucket is unreachable, retry at most this far apart, so a
    #: mirror moves again within about this long after the link returns.
    retry_cap_ms: int = 1_000

    def __post_init__(self) -> None:
        if self.poll_interval_ms <= 0 or self.max_poll_interval_ms < self.poll_interval_ms:
            raise ConfigError("mirror.poll_interval_ms must be > 0 and <= max_poll_interval_ms")
        if self.prefetch < 1:
            raise ConfigError("mirror.prefetch must be >= 1")
        if self.retry_cap_ms < 100:
            raise ConfigError("mirror.retry_cap_ms must be >= 100")


@dataclass(frozen=True, slots=True)
class GcSettings:
    """Deleting this region's old log objects from the bucket (home side)."""

    enabled: bool = True
    #: How often to look for deletable objects.
    interval_ms: int = 600_000
    #: Nothing younger than this is deleted (the pipeline and late readers use it).
    retention_ms: int = 7 * 24 * 3600 * 1000
    #: Keep objects until every subscribed region has mirrored them ...
    retain_until_mirrored: bool = True
    #: ... but never longer than this: a dead reader cannot fill the bucket forever.
    age_cap_ms: int = 30 * 24 * 3600 * 1000

    def __post_init__(self) -> None:
        if self.interval_ms <= 0:
            raise ConfigError("gc.interval_ms must be > 0")
        if self.retention_ms < 0 or self.age_cap_ms < self.retention_ms:
            raise ConfigError("gc.retention_ms must be >= 0 and <= gc.age_cap_ms")


@dataclass(frozen=True, slots=True)
class MetadataSettings:
    """The metadata server this gateway takes its topic routing from (no ``url``: static mode)."""

    #: ``http(s)://host:port`` of the metadata server; empty: the topology is ``[[topics]]``.
    #: Several replicas, comma-separated: the gateway uses one and fails over
    #: to the next when it is unreachable or answers 5xx (docs/metadata.md).
    url: str = ""
    #: This region's bearer token (``edgegw regions add``); better in
    #: ``EDGEGW_METADATA_TOKEN``. Empty only for a server in open mode.
    token: str = field(default="", repr=False)
    #: Ask for the routing table this often (one cheap 304 while it is unchanged).
    poll_interval_ms: int = 5_000
    #: Report liveness, version and lag figures this often.
    heartbeat_interval_ms: int = 10_000
    #: Report this region's log head after each commit, and let idle tailers
    #: wait for relayed heads instead of polling the bucket.
    head_relay: bool = True
    #: How long one long poll for relayed heads waits on the server.
    relay_wait_ms: int = 25_000
    #: While the relay is healthy, an idle tailer still asks the bucket this
    #: often, as a safety net (0: never).
    relay_safety_poll_ms: int = 300_000
    #: The last routing table on disk; default ``<data_dir>/routing.json``.
    cache_path: str = ""
    #: Seconds per request to the metadata server (the long poll adds its wait).
    timeout_s: float = 10.0
    #: CA bundle (PEM) to verify an ``https`` server with; default: the system's.
    ca_file: str = ""
    #: A file holding this region's token instead of ``token``: read at start
    #: and again whenever the server refuses the token, so a rotated token
    #: (``edgegw regions rotate``) is taken up without a restart.
    token_file: str = ""

    def __post_init__(self) -> None:
        if self.url:
            for url in self.urls:
                if not re.match(r"^https?://[^/\s,]+", url):
                    raise ConfigError(f"metadata.url: {url!r} is not an http:// or https:// URL")
        if self.token and self.token_file:
            raise ConfigError("metadata.token and metadata.token_file: set one of them")
        if self.poll_interval_ms < 100:
            raise ConfigError("metadata.poll_interval_ms must be >= 100")
        if self.heartbeat_interval_ms < 100:
            raise ConfigError("metadata.heartbeat_interval_ms must be >= 100")
        if not 100 <= self.relay_wait_ms <= 60_000:
            raise ConfigError("metadata.relay_wait_ms must be 100..60000")
        if self.relay_safety_poll_ms < 0:
            raise ConfigError("metadata.relay_safety_poll_ms must be >= 0 (0: never)")
        if self.timeout_s <= 0:
            raise ConfigError("metadata.timeout_s must be > 0")

    @property
    def enabled(self) -> bool:
        return bool(self.url)

    @property
    def urls(self) -> tuple[str, ...]:
        """The servers of ``url`` (comma-separated), in order."""
        return tuple(u.strip() for u in self.url.split(","))

    def cache_file(self, data_dir: Path) -> Path:
        return Path(self.cache_path) if self.cache_path else data_dir / "routing.json"


@dataclass(frozen=True, slots=True)
class _MqttBroker:
    """How to reach the site's MQTT broker (``[[mqtt.ingest]]`` and ``[[mqtt.publish]]``)."""

    host: str = "127.0.0.1"
    port: int = 1883
    #: TLS to the broker: on when ``tls`` is true or any of the files is set.
    tls: bool = False
    #: CA bundle (PEM) to verify the broker with; empty: the system's.
    ca_file: str = ""
    #: Client certificate and key (PEM) when the broker authenticates clients by certificate.
    cert_file: str = ""
    key_file: str = ""
    username: str = ""
    #: The password comes from a file or an environment variable, never from the config.
    password_file: str = ""
    password_env: str = ""
    #: Empty: ``edgegw-<region>-<name>`` (ingest) or ``edgegw-<region>-pub-<name>`` (publish).
    client_id: str = ""
    keepalive_s: int = 30

    def _check_broker(self, where: str) -> None:
        if not self.host or any(c.isspace() for c in self.host):
            raise ConfigError(f"{where}.host: {self.host!r} is not a host name or address")
        if not 1 <= self.port <= 65535:
            raise ConfigError(f"{where}.port must be 1..65535")
        if self.password_file and self.password_env:
            raise ConfigError(f"{where}: set password_file or password_env, not both")
        if (self.password_file or self.password_env) and not self.username:
            raise ConfigError(f"{where}: a password needs a username")
        if self.password_env.startswith(ENV_PREFIX):
            raise ConfigError(
                f"{where}.password_env: {self.password_env!r}: names starting with {ENV_PREFIX} "
                "are config overrides; use another name (like MQTT_PASSWORD)"
            )
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError(f"{where}: cert_file and key_file go together")
        if len(self.client_id.encode()) > 65535:
            raise ConfigError(f"{where}.client_id is too long")
        if not 5 <= self.keepalive_s <= 65535:
            raise ConfigError(f"{where}.keepalive_s must be 5..65535")

    @property
    def uses_tls(self) -> bool:
        return self.tls or bool(self.ca_file or self.cert_file)

    def describe(self) -> str:
        return f"mqtt{'s' if self.uses_tls else ''}://{self.host}:{self.port}"

    def password(self, where: str) -> str | None:
        """The broker password from ``password_file`` or ``password_env`` (None: none)."""
        if self.password_file:
            try:
                return Path(self.password_file).read_text(encoding="utf-8").strip("\r\n")
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(
                    f"{where}.password_file: cannot read {self.password_file}: {_os_reason(exc)}"
                ) from None
        if self.password_env:
            value = os.environ.get(self.password_env)
            if value is None:
                raise ConfigError(
                    f"{where}.password_env: the environment variable {self.password_env} is not set"
                )
            return value
        return None


@dataclass(frozen=True, slots=True)
class MqttIngestConfig(_MqttBroker):
    """One ``[[mqtt.ingest]]``: topic filters of the site's broker journaled into a topic."""

    #: MQTT topic filters subscribed to (QoS 1, persistent session).
    filters: tuple[str, ...] = ()
    #: The edgegw topic (homed here) the messages are journaled in.
    topic: str = ""
    #: The name in status, metrics and logs; empty: the topic's name.
    name: str = ""
    #: ``topic``: the MQTT topic name is the record's key; any other value
    #: names an MQTT 5 user property whose value is the key (the topic name
    #: goes in header ``mqtt-topic`` then).
    key_from: str = "topic"
    #: Only QoS 1 (at least once; PUBACK after the journal holds the message).
    qos: int = 1
    #: Messages handed from the MQTT client to the journal at most at once
    #: (also the MQTT 5 receive maximum asked of the broker).
    max_inflight: int = 1000
    #: Messages journaled in one append at most (one fsync for all).
    max_batch: int = 500
    #: A filter that gets no message for this long is reported (log warning, status).
    idle_warning_s: float = 60.0

    def __post_init__(self) -> None:
        where = f"mqtt.ingest[{self.name or self.topic}]"
        self._check_broker(where)
        if not self.filters:
            raise ConfigError(f'{where}.filters: required (MQTT topic filters, like ["sensors/#"])')
        for f in self.filters:
            try:
                validate_filter(f)
            except EdgeGatewayError as exc:
                raise ConfigError(f"{where}.filters: {exc}") from None
        if len(set(self.filters)) != len(self.filters):
            raise ConfigError(f"{where}.filters: a filter is listed twice")
        if not self.topic:
            raise ConfigError(f"{where}.topic: required (the edgegw topic to journal into)")
        try:
            validate_home_topic(self.topic)
        except EdgeGatewayError as exc:
            raise ConfigError(f"{where}.topic: {exc}") from None
        if self.name:
            _check_bridge_name(self.name, where)
        if not self.key_from:
            raise ConfigError(f"{where}.key_from: 'topic' or an MQTT 5 user property name")
        if self.qos != 1:
            raise ConfigError(
                f"{where}.qos: only 1 is supported (at least once, acknowledged after the "
                "journal holds the message)"
            )
        if not 1 <= self.max_inflight <= 65535:
            raise ConfigError(f"{where}.max_inflight must be 1..65535")
        if not 1 <= self.max_batch <= 100_000:
            raise ConfigError(f"{where}.max_batch must be 1..100000")
        if self.idle_warning_s <= 0:
            raise ConfigError(f"{where}.idle_warning_s must be > 0")

    @property
    def bridge_name(self) -> str:
        return self.name or self.topic


@dataclass(frozen=True, slots=True)
class MqttPublishConfig(_MqttBroker):
    """One ``[[mqtt.publish]]``: topics (mirrors or local) published into the site's broker."""

    #: edgegw topics to publish: mirror topics (``<region>.<topic>``) or topics homed here.
    topics: tuple[str, ...] = ()
    #: The MQTT topic of each record; fields {region} (the topic's home),
    #: {topic} (its name there), {key}, {partition}, {offset}.
    template: str = "edgegw/{region}/{topic}/{key}"
    #: The name in status, metrics, logs and its consumer group; required.
    name: str = ""
    #: The consumer group its progress is kept in; empty: ``mqtt-publish-<name>``.
    group: str = ""
    qos: int = 1
    #: Publish with the MQTT retain flag (the broker keeps the last message per topic).
    retain: bool = False
    #: Messages in flight to the broker (sent, PUBACK not yet back).
    max_inflight: int = 100
    #: Records read and published per round (progress is committed after each).
    max_batch: int = 500

    def __post_init__(self) -> None:
        where = f"mqtt.publish[{self.name}]" if self.name else "mqtt.publish"
        self._check_broker(where)
        if not self.name:
            raise ConfigError(f"{where}.name: required (names its consumer group and metrics)")
        _check_bridge_name(self.name, where)
        if not self.topics:
            raise ConfigError(f"{where}.topics: required (edgegw topics to publish)")
        for t in self.topics:
            try:
                validate_topic(t)
            except EdgeGatewayError as exc:
                raise ConfigError(f"{where}.topics: {exc}") from None
        try:
            validate_template(self.template)
        except EdgeGatewayError as exc:
            raise ConfigError(f"{where}.template: {exc}") from None
        try:
            validate_group(self.group_name)
        except EdgeGatewayError as exc:
            raise ConfigError(f"{where}.group: {exc}") from None
        if self.qos != 1:
            raise ConfigError(f"{where}.qos: only 1 is supported (at least once)")
        if not 1 <= self.max_inflight <= 65535:
            raise ConfigError(f"{where}.max_inflight must be 1..65535")
        if not 1 <= self.max_batch <= 100_000:
            raise ConfigError(f"{where}.max_batch must be 1..100000")

    @property
    def group_name(self) -> str:
        return self.group or f"mqtt-publish-{self.name}"


_BRIDGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def _check_bridge_name(name: str, where: str) -> None:
    if not _BRIDGE_NAME.fullmatch(name):
        raise ConfigError(
            f"{where}.name: {name!r}: 1-63 letters, digits, '_', '.' or '-', starting with a "
            "letter or digit"
        )


@dataclass(frozen=True, slots=True)
class MqttConfig:
    """``[mqtt]``: the bridge to the site's MQTT broker (docs/mqtt.md)."""

    ingest: tuple[MqttIngestConfig, ...] = ()
    publish: tuple[MqttPublishConfig, ...] = ()

    def __post_init__(self) -> None:
        names = [c.bridge_name for c in self.ingest]
        for n in names:
            if names.count(n) > 1:
                raise ConfigError(f"mqtt.ingest: two have the name {n!r} (set name = ...)")
        pub = [c.name for c in self.publish]
        for n in pub:
            if pub.count(n) > 1:
                raise ConfigError(f"mqtt.publish: two have the name {n!r}")
        ids = [c.client_id for c in (*self.ingest, *self.publish) if c.client_id]
        for i in ids:
            if ids.count(i) > 1:
                raise ConfigError(
                    f"mqtt: client_id {i!r} is used twice (the broker would drop one connection "
                    "whenever the other connects)"
                )

    @property
    def configured(self) -> bool:
        return bool(self.ingest or self.publish)


@dataclass(frozen=True, slots=True)
class LogConfig:
    level: Literal["debug", "info", "warning", "error"] = "info"
    #: ``text`` for people, ``json`` (one object per line) for log collectors.
    format: Literal["text", "json"] = "text"


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """One topic of the fleet's static topology."""

    name: str
    #: The region whose gateway accepts writes for it.
    home: str
    partitions: int = 1
    #: Regions that mirror it: a list, or ``["*"]`` for every other region.
    subscribers: tuple[str, ...] = ()
    #: Which journal lane holds it and so when it ships after an outage
    #: (``critical`` first, then ``normal``, then ``bulk``); docs/journal.md, "Lanes".
    priority: Priority = Priority.NORMAL
    #: When its lane's disk budget is full: refuse appends (``block``) or delete the
    #: lane's oldest unshipped segments, reporting the exact gap (``drop-oldest``).
    #: A ``drop-oldest`` topic has a lane of its own; docs/journal.md, "Drop-oldest lanes".
    on_full: OnFull = OnFull.BLOCK

    def __post_init__(self) -> None:
        validate_topic(self.name)
        validate_region(self.home)
        if not 1 <= self.partitions <= 100_000:
            raise ConfigError(f"topics[{self.name}].partitions must be 1..100000")
        for s in self.subscribers:
            if s != "*":
                validate_region(s)

    def subscribed_by(self, region: str) -> bool:
        return region != self.home and ("*" in self.subscribers or region in self.subscribers)


@dataclass(frozen=True, slots=True)
class IdempotenceConfig:
    """``[idempotence]``: how many idempotent producers are remembered, and for how long.

    docs/api.md, "Idempotent produce": beyond these limits a producer is
    forgotten and its next produce gets ``unknown_producer``.
    """

    #: Producers remembered at most; past this the one idle longest is forgotten.
    max_producers: int = 10_000
    #: A producer idle (no produce, no init) this long is forgotten (Kafka's
    #: ``producer.id.expiration.ms``, default 24 h).
    producer_expiry_ms: int = 24 * 3600 * 1000

    def __post_init__(self) -> None:
        if not 1 <= self.max_producers <= 1_000_000:
            raise ConfigError("idempotence.max_producers must be 1..1000000")
        if self.producer_expiry_ms < 1000:
            raise ConfigError("idempotence.producer_expiry_ms must be >= 1000")


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Everything ``edgegw serve`` needs; see ``docs/configuration.md``."""

    region: str
    data_dir: Path = Path("edgegw-data")
    #: Producing to an unknown topic creates it, homed here, with
    #: ``default_partitions`` partitions (otherwise: 404).
    auto_create: bool = False
    default_partitions: int = 1
    #: Seconds to flush and finish in-flight uploads on SIGTERM before exiting.
    shutdown_grace_s: float = 10.0
    journal: JournalConfig = field(default_factory=JournalConfig)
    shipper: ShipperConfig = field(default_factory=ShipperConfig)
    bucket: BucketConfig = field(default_factory=BucketConfig)
    link: LinkConfig = field(default_factory=LinkConfig)
    mirror: MirrorConfig = field(default_factory=MirrorConfig)
    gc: GcSettings = field(default_factory=GcSettings)
    clock: ClockConfig = field(default_factory=ClockConfig)
    api: ApiConfig = field(default_factory=ApiConfig)
    metadata: MetadataSettings = field(default_factory=MetadataSettings)
    log: LogConfig = field(default_factory=LogConfig)
    encryption: EncryptionConfig = field(default_factory=EncryptionConfig)
    mqtt: MqttConfig = field(default_factory=MqttConfig)
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    idempotence: IdempotenceConfig = field(default_factory=IdempotenceConfig)
    topics: tuple[TopicConfig, ...] = ()

    def __post_init__(self) -> None:
        try:
            validate_region(self.region)
        except InvalidName as exc:
            raise ConfigError(f"region: {exc}") from None
        if not 1 <= self.default_partitions <= 100_000:
            raise ConfigError("default_partitions must be 1..100000")
        if self.shutdown_grace_s < 0:
            raise ConfigError("shutdown_grace_s must be >= 0")
        seen: set[str] = set()
        for t in self.topics:
            if t.name in seen:
                raise ConfigError(f"topics: {t.name!r} is defined twice")
            seen.add(t.name)
        if (
            self.link.bulk_windows
            and not self.metadata.enabled
            and not any(t.priority == "bulk" for t in self.topics)
        ):
            # A setting with no effect is refused, not accepted silently. (With
            # a metadata server the routing table says which topics are bulk.)
            raise ConfigError(
                'link.bulk_windows: no [[topics]] has priority = "bulk", so no data is bulk '
                "and the windows would hold nothing (auto-created topics are normal); give "
                "the bulk topics that priority, or remove link.bulk_windows"
            )
        if self.metadata.enabled and self.topics:
            raise ConfigError(
                "topics: with metadata.url set, the metadata server holds the topology; "
                "remove the [[topics]] tables (or metadata.url for static mode)"
            )
        self._check_mqtt_topics()
        if self.kafka.enabled and not self.kafka.is_loopback and not self.api.token:
            raise ConfigError(
                f"api.token: required when kafka.listen ({self.kafka.listen}) is not a loopback "
                "address (Kafka clients then authenticate with SASL/PLAIN and the token)"
            )

    def _check_mqtt_topics(self) -> None:
        """In static mode, the bridge's topics must be ones this gateway has."""
        if self.metadata.enabled:
            return  # the routing table decides; the bridge reports unknown topics
        local = self.local_topics()
        mirrors = self.mirrored_topics()
        for ing in self.mqtt.ingest:
            if ing.topic in local or self.auto_create:
                continue
            other = next((t for t in self.topics if t.name == ing.topic), None)
            if other is not None:
                raise ConfigError(
                    f"mqtt.ingest[{ing.bridge_name}].topic: {ing.topic!r} is homed in region "
                    f"{other.home!r}, not here: ingest writes topics homed here"
                )
            raise ConfigError(
                f"mqtt.ingest[{ing.bridge_name}].topic: unknown topic {ing.topic!r} (define it "
                "in [[topics]] with home = this region, or set auto_create = true)"
            )
        for pub in self.mqtt.publish:
            for t in pub.topics:
                if t not in local and t not in mirrors:
                    raise ConfigError(
                        f"mqtt.publish[{pub.name}].topics: {t!r} is neither a topic homed here nor "
                        "a mirror topic (<region>.<topic>) this region subscribes to"
                    )

    @property
    def journal_path(self) -> Path:
        return self.data_dir / "journal"

    def local_topics(self) -> dict[str, TopicConfig]:
        """Topics homed here (writable)."""
        return {t.name: t for t in self.topics if t.home == self.region}

    def mirrored_topics(self) -> dict[str, TopicConfig]:
        """Local mirror topic name (``<home>.<topic>``) → the source topic."""
        return {
            mirror_topic(t.home, t.name): t for t in self.topics if t.subscribed_by(self.region)
        }

    def subscribers(self) -> list[str] | None:
        """Regions that mirror something homed here; ``None`` when a topic says ``*``."""
        return topology_subscribers(self.topics, self.region)

    def sources(self) -> dict[str, list[str]]:
        """Source region → the topics this region mirrors from it."""
        return topology_sources(self.topics, self.region)


def topology_subscribers(topics: typing.Iterable[TopicConfig], region: str) -> list[str] | None:
    """Regions that mirror something homed in ``region``; ``None`` when a topic says ``*``."""
    out: set[str] = set()
    for t in topics:
        if t.home == region:
            if "*" in t.subscribers:
                return None
            out.update(t.subscribers)
    return sorted(out)


def topology_sources(topics: typing.Iterable[TopicConfig], region: str) -> dict[str, list[str]]:
    """Source region → the topics ``region`` mirrors from it."""
    out: dict[str, list[str]] = {}
    for t in topics:
        if t.subscribed_by(region):
            out.setdefault(t.home, []).append(t.name)
    return out


# --------------------------------------------------------------- loading


def load_config(
    path: str | os.PathLike[str], env: Mapping[str, str] | None = None
) -> GatewayConfig:
    """Read, override from the environment, validate. Raises :class:`ConfigError`
    whose message starts with the file's path (``edgegw.toml: journal.fsync: ...``)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such config file (create one with `edgegw init`)") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a directory, not a config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read: {_os_reason(exc)}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    try:
        return parse_config(doc, env=os.environ if env is None else env, base_dir=p.parent)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None


def _os_reason(exc: OSError | UnicodeDecodeError) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


#: ``EDGEGW_*`` variables that are not config overrides: options of other
#: commands (``envvar=`` in cli/edgegw_cli/). A config load accepts them and
#: refuses any other ``EDGEGW_*`` name that is not a key's override, so a typo
#: is caught instead of silently ignored. (``EDGEGW_API_TOKEN``,
#: ``EDGEGW_METADATA_URL`` and ``EDGEGW_METADATA_TOKEN``, also read by CLI
#: commands, are config keys' overrides.)
NON_CONFIG_ENV: frozenset[str] = frozenset(
    {
        "EDGEGW_METADATA_ADMIN_TOKEN",  # edgegw metadata serve --admin-token
        "EDGEGW_S3_ACCESS_KEY",  # edgegw pipeline run --access-key
        "EDGEGW_S3_SECRET_KEY",  # edgegw pipeline run --secret-key
        "EDGEGW_FAILPOINTS",  # edge_gateway.failpoints: faults for tests of real processes
        "EDGEGW_CA_FILE",  # edgegw status/produce/consume/topics --ca-file
        "EDGEGW_CLIENT_CERT",  # ... --client-cert
        "EDGEGW_CLIENT_KEY",  # ... --client-key
    }
)


def env_overrides() -> dict[str, str]:
    """Each config key's environment variable → the key (``EDGEGW_API_LISTEN`` → ``api.listen``)."""
    out: dict[str, str] = {}
    for f in dataclasses.fields(GatewayConfig):
        if f.name in ("topics", "encryption", "mqtt"):  # tables of tables; keys never from env
            continue
        if _is_section(f.name):
            for sub in dataclasses.fields(_section_class(f.name)):
                out[f"{ENV_PREFIX}{f.name.upper()}_{sub.name.upper()}"] = f"{f.name}.{sub.name}"
        else:
            out[f"{ENV_PREFIX}{f.name.upper()}"] = f.name
    return out


def key_source(key: str, env: Mapping[str, str] | None = None) -> str:
    """``key``, plus where its value came from when that was the environment:
    ``api.listen (from EDGEGW_API_LISTEN)``. For messages about a loaded config."""
    env = os.environ if env is None else env
    for var, k in env_overrides().items():
        if k == key and var in env:
            return f"{key} (from {var})"
    return key


def parse_config(
    doc: Mapping[str, Any],
    *,
    env: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
) -> GatewayConfig:
    """Build a :class:`GatewayConfig` from a parsed TOML document and ``env``'s
    ``EDGEGW_*`` overrides (an unknown ``EDGEGW_*`` name is an error)."""
    data = dict(doc)
    env = env or {}
    overrides = env_overrides()
    enc = data.get("encryption")
    key_env = enc.get("key_env") if isinstance(enc, Mapping) else None
    # The variable that holds the write key may be named EDGEGW_...: not a config key.
    _check_env_names({k: v for k, v in env.items() if k != key_env}, overrides)
    # Environment overrides, applied before validation so errors name the key
    # (and say that its value came from the environment).
    from_env: dict[str, str] = {}
    for var, key in overrides.items():
        if var not in env:
            continue
        section, dot, sub = key.partition(".")
        if dot:
            table = dict(_table(data.get(section, {}), section))
            table[sub] = _from_env(env[var], typing.get_type_hints(_section_class(section))[sub])
            data[section] = table
        else:
            data[key] = _from_env(env[var], typing.get_type_hints(GatewayConfig)[key])
        from_env[key] = var
    try:
        return _parse(data, base_dir)
    except ConfigError as exc:
        raise ConfigError(_name_source(str(exc), from_env)) from None


def _check_env_names(env: Mapping[str, str], overrides: Mapping[str, str]) -> None:
    unknown = sorted(
        var
        for var in env
        if var.startswith(ENV_PREFIX) and var not in overrides and var not in NON_CONFIG_ENV
    )
    if not unknown:
        return
    import difflib  # only on this error path: not a cost of every start

    known = [v.removeprefix(ENV_PREFIX) for v in overrides]
    hints = []
    for var in unknown:
        close = difflib.get_close_matches(var.removeprefix(ENV_PREFIX), known, n=1)
        hints.append(f"{var}" + (f" (did you mean {ENV_PREFIX}{close[0]}?)" if close else ""))
    raise ConfigError(
        f"unknown environment variable{'s' if len(unknown) > 1 else ''} {', '.join(hints)}: "
        f"config keys are overridden as {ENV_PREFIX}<SECTION>_<KEY> (docs/configuration.md)"
    )


def _name_source(message: str, from_env: Mapping[str, str]) -> str:
    """``message`` with "(from EDGEGW_...)" after the key it starts with, if that key's
    value came from the environment."""
    for key, var in from_env.items():
        if message.startswith(key) and message[len(key) : len(key) + 1] in (":", " "):
            return f"{key} (from {var}){message[len(key) :]}"
    return message


def _parse(data: Mapping[str, Any], base_dir: Path | None) -> GatewayConfig:
    sections = {f.name: f for f in dataclasses.fields(GatewayConfig) if _is_section(f.name)}
    if "region" not in data:
        raise ConfigError("region: required (this gateway's region name)")
    kwargs: dict[str, Any] = {}
    hints = typing.get_type_hints(GatewayConfig)
    for key, value in data.items():
        if key == "topics":
            kwargs["topics"] = _topics(value)
        elif key == "encryption":
            kwargs[key] = parse_encryption(_table(value, key))
        elif key == "mqtt":
            kwargs["mqtt"] = _mqtt(value)
        elif key in sections:
            kwargs[key] = _build(_section_class(key), _table(value, key), key)
        elif key in hints:
            kwargs[key] = _convert(value, hints[key], key)
        else:
            raise ConfigError(f"{key}: unknown key{_suggest(key, hints)}")
    data_dir = kwargs.get("data_dir")
    if isinstance(data_dir, Path) and not data_dir.is_absolute() and base_dir is not None:
        kwargs["data_dir"] = base_dir / data_dir
    api = kwargs.get("api")
    if isinstance(api, ApiConfig) and base_dir is not None:
        # The API's TLS files are relative to the config file, like data_dir.
        files: dict[str, Any] = {
            key: str(base_dir / value)
            for key in _API_TLS_FILES
            if (value := getattr(api, key)) and not Path(value).is_absolute()
        }
        kwargs["api"] = dataclasses.replace(api, **files)
    cfg: GatewayConfig = _construct(GatewayConfig, kwargs, "")
    return cfg


_API_TLS_FILES = ("tls_cert", "tls_key", "tls_client_ca", "tls_ca")

_SECTIONS: dict[str, type[Any]] = {
    "journal": JournalConfig,
    "shipper": ShipperConfig,
    "bucket": BucketConfig,
    "link": LinkConfig,
    "mirror": MirrorConfig,
    "gc": GcSettings,
    "clock": ClockConfig,
    "api": ApiConfig,
    "kafka": KafkaConfig,
    "metadata": MetadataSettings,
    "log": LogConfig,
    "idempotence": IdempotenceConfig,
}


def _is_section(name: str) -> bool:
    return name in _SECTIONS


def _section_class(name: str) -> type[Any]:
    return _SECTIONS[name]


def _table(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: must be a table ([{where}])")
    return value


def _topics(value: object) -> tuple[TopicConfig, ...]:
    if not isinstance(value, list):
        raise ConfigError("topics: must be an array of tables ([[topics]])")
    out = []
    for i, row in enumerate(value):
        where = f"topics[{i}]"
        table = _table(row, where)
        if "subscribers" in table and isinstance(table["subscribers"], str):
            table = {**table, "subscribers": [table["subscribers"]]}
        topic: TopicConfig = _build(TopicConfig, table, where)
        try:
            validate_home_topic(topic.name)  # stricter than TopicConfig: see names.py
        except InvalidName as exc:
            raise ConfigError(f"{where}.name: {exc}") from None
        out.append(topic)
    return tuple(out)


def _mqtt(value: object) -> MqttConfig:
    table = _table(value, "mqtt")
    kinds: dict[str, type[Any]] = {"ingest": MqttIngestConfig, "publish": MqttPublishConfig}
    kwargs: dict[str, Any] = {}
    for key, rows in table.items():
        cls = kinds.get(key)
        if cls is None:
            raise ConfigError(f"mqtt.{key}: unknown key{_suggest(key, kinds)}")
        if not isinstance(rows, list):
            raise ConfigError(f"mqtt.{key}: must be an array of tables ([[mqtt.{key}]])")
        built = []
        for i, row in enumerate(rows):
            t = _table(row, f"mqtt.{key}[{i}]")
            if isinstance(t.get("filters"), str):
                t = {**t, "filters": [t["filters"]]}
            if isinstance(t.get("topics"), str):
                t = {**t, "topics": [t["topics"]]}
            built.append(_build(cls, t, f"mqtt.{key}[{i}]"))
        kwargs[key] = tuple(built)
    cfg: MqttConfig = _construct(MqttConfig, kwargs, "mqtt")
    return cfg


def _build(cls: type[Any], table: Mapping[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        if key not in names:
            raise ConfigError(f"{where}.{key}: unknown key{_suggest(key, names)}")
        kwargs[key] = _convert(value, hints[key], f"{where}.{key}")
    return _construct(cls, kwargs, where)


def _construct(cls: type[Any], kwargs: dict[str, Any], where: str) -> Any:
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except TypeError as exc:  # a required key is missing
        missing = re.findall(r"'(\w+)'", str(exc))
        key = f"{where}.{missing[0]}" if where and missing else (missing[0] if missing else where)
        raise ConfigError(f"{key}: required") from None
    except EdgeGatewayError as exc:  # InvalidName and friends
        raise ConfigError(f"{where or 'config'}: {exc}") from None


def _convert(value: object, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in args if a is not type(None)]
        return _convert(value, options[0], key)
    if origin is Literal:
        if value not in args:
            choices = ", ".join(repr(a) for a in args)
            raise ConfigError(f"{key}: {value!r} is not one of {choices}")
        return value
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: must be a table ({{ name = value, ... }})")
        out: dict[Any, Any] = {}
        for k, v in value.items():
            sub = f"{key}.{k}"
            if isinstance(v, str) and args[1] is int:
                out[_convert(k, args[0], sub)] = _size(v, sub)
            else:
                out[_convert(k, args[0], sub)] = _convert(v, args[1], sub)
        return out
    if origin is tuple:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: must be a list")
        return tuple(_convert(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            choices = ", ".join(str(m.value) for m in hint)
            raise ConfigError(f"{key}: {value!r} is not one of {choices}") from None
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: must be true or false, not {value!r}")
        return value
    if hint is int:
        if isinstance(value, str) and key.endswith(("bytes", "bytes_per_s")):
            return _size(value, key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: must be an integer, not {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: must be a number, not {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: must be a string, not {value!r}")
        return value
    if hint is Path:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{key}: must be a path string")
        return Path(value).expanduser()
    raise ConfigError(f"{key}: unsupported setting")  # pragma: no cover - a new field type


def parse_size(text: str, what: str) -> int:
    """A size written as in the config (``4096``, ``'64MiB'``, ``'2GB'``) in bytes; a
    :class:`ConfigError` naming ``what`` otherwise (command-line options use it too)."""
    return _size(text, what)


def _size(text: str, key: str) -> int:
    m = _SIZE.match(text)
    if not m:
        raise ConfigError(f"{key}: {text!r} is not a size (like 4096, '64MiB' or '2GB')")
    return int(m.group(1)) * _UNITS[m.group(2)]


def _from_env(text: str, hint: Any) -> object:
    """An environment value: as is for strings and paths, else in TOML scalar syntax."""
    if hint in (str, Path) or typing.get_origin(hint) is Literal:
        return text
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _suggest(key: str, names: typing.Iterable[str]) -> str:
    import difflib  # only on this error path: not a cost of every start

    close = difflib.get_close_matches(key, list(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def starter_config(region: str, data_dir: str = "edgegw-data") -> str:
    """A commented starter file (``edgegw init``); every key shows its default."""
    validate_region(region)
    # JSON's string escapes are valid in a TOML basic string: any path stays one value
    return _STARTER.format(
        region=region, data_dir=json.dumps(data_dir, ensure_ascii=False), port=DEFAULT_PORT
    )


_STARTER = """\
# edgegw gateway configuration. Every key is documented in docs/configuration.md;
# commented-out keys show their defaults. Secrets can come from the environment:
# EDGEGW_<SECTION>_<KEY>, e.g. EDGEGW_BUCKET_SECRET_KEY, EDGEGW_API_TOKEN.

# This site's region name (letters, digits, '-', '_'; unique in the fleet).
region = "{region}"
# Journal, group offsets, shipper state (and the local bucket by default: see
# [bucket] before deleting this directory).
data_dir = {data_dir}
# Producing to an unknown topic creates it here with default_partitions.
# auto_create = false
# default_partitions = 1
# shutdown_grace_s = 10.0

[journal]
# fsync = "interval"          # always | interval | never
# fsync_interval_ms = 5.0
# segment_bytes = "64MiB"
# max_bytes = "4GiB"          # disk budget: produce gets 503 journal_full beyond it
# retention_ms = 86400000     # keep shipped data for local readers this long
# scrub_interval = "24h"      # re-read every sealed segment once in this long ("off": never)
# at_rest = "compressed"     # rewrite sealed segments compressed in the background ("off": never)
# at_rest_level = 3           # zstd level of that rewrite

[shipper]
# flush_interval_ms = 250     # the oldest unshipped record waits at most this long
# max_object_bytes = "8MiB"
# backlog_object_bytes = "16MiB" # a backlog ships as objects of up to this much
# manifest_interval_ms = 10000
# manifest_every = 100
# pack_max_bytes = "4MiB"     # copies of small entries for readers far behind (0: none)
# pack_entry_max_bytes = "64KiB"
# compression_level = 1

[bucket]
# The shared bucket all regions ship to. The default is a local directory
# (<data_dir>/bucket): enough for one machine and for trying edgegw out.
# It lives INSIDE the data directory: deleting the data directory deletes the
# bucket too, with every shipped record and the region's offsets. Set `path`
# to a directory outside data_dir to keep the two apart.
type = "local"
# path = ""
# prefix = ""
# For S3 (AWS, MinIO, R2, Ceph):
# type = "s3"
# bucket = "edgegw-fleet"
# endpoint_url = "https://minio.example:9000"
# region = "eu-west-1"
# path_style = true
# access_key = ""             # or the standard AWS credential chain (read again
# secret_key = ""             #   when refused); better: EDGEGW_BUCKET_SECRET_KEY
# profile = ""                # e.g. one with a credential_process (docs/operations.md)
# For Azure Blob Storage (pip install 'edgegw[azure]'; docs/stores.md):
# type = "azure"
# container = "edgegw-fleet"
# connection_string_file = "/etc/edgegw/azure-connection-string"
# For Google Cloud Storage (pip install 'edgegw[gcs]'; docs/stores.md):
# type = "gcs"
# bucket = "edgegw-fleet"
# credentials_file = ""       # a service account key; unset: Application Default Credentials

[link]
# The site's link to the bucket. A cap paces uploads and downloads together;
# bytes moved per day and month are metrics (edgegw_link_*) and in status.
# max_bytes_per_s = 0         # e.g. "4MB" (4,000,000 B/s); 0: no cap
# daily_bytes = 0             # e.g. "2GiB" per local day, both directions; 0: none
# monthly_bytes = 0           # e.g. "40GiB" per local month; past an allowance
#                             #   only critical data moves (docs/operations.md)

[mirror]
# poll_interval_ms = 100
# max_poll_interval_ms = 2000
# gap_policy = "fail"         # fail | skip
# prefetch = 8

[gc]
# enabled = true
# interval_ms = 600000
# retention_ms = 604800000     # keep objects in the bucket at least 7 days ...
# retain_until_mirrored = true # ... and until every subscriber mirrored them ...
# age_cap_ms = 2592000000      # ... but at most 30 days (ages on the bucket's clock)

[clock]
# warn_skew_ms = 60000          # WARNING when this clock and the bucket's differ by more
# gc_pause_skew_ms = 3600000    # beyond this, bucket GC deletes nothing

[api]
# listen = "127.0.0.1:{port}"  # a token is required on a non-loopback address
# token = ""                   # better: EDGEGW_API_TOKEN
# max_body_bytes = "16MiB"
# server = "builtin"           # or "hypercorn" (docs/api.md, "Choosing the server")
# keep_alive_timeout_s = 75.0  # idle connections (and unfinished request heads) close after
# read_timeout_s = 60.0        # each read of a request body; 408 and close after
# tls_cert = ""                # with tls_key: HTTPS only (paths relative to this file)
# tls_key = ""
# tls_client_ca = ""           # require client certificates signed by this CA (mutual TLS)
# tls_ca = ""                  # what edgegw status/produce/... verify with (default: tls_cert)

[kafka]
# Kafka clients produce and consume here too (docs/kafka.md); TLS as [api].
# listen = "127.0.0.1:9092"    # off while empty; non-loopback needs api.token (SASL/PLAIN)
# advertised = ""              # host:port clients are told to use (NAT, DNS names)
# acks_all = "local"           # or "shipped": acks=all waits for the bucket

[metadata]
# The metadata server holds the fleet's topic routing (docs/metadata-api.md).
# With a url, remove the [[topics]] below: the server's routing table replaces them.
# url = "http://127.0.0.1:8471"
# token = ""                   # this region's token; better: EDGEGW_METADATA_TOKEN
# token_file = ""              # or a file holding it: re-read when refused (rotation)
# poll_interval_ms = 5000
# heartbeat_interval_ms = 10000
# head_relay = true            # idle mirrors wait for relayed heads: no bucket polling
# relay_wait_ms = 25000
# relay_safety_poll_ms = 300000
# cache_path = ""              # default <data_dir>/routing.json
# timeout_s = 10.0
# ca_file = ""

# [encryption]                 # seal this region's log objects (AES-256-GCM; docs/security.md)
# key_file = "/etc/edgegw/keys/{region}-2026-11.key"  # edgegw encryption keygen -o PATH
# decrypt_keys = []            # older keys of this region (after a rotation)
# [encryption.sources.south]   # keys of a region mirrored here, if it encrypts
# key_files = ["/etc/edgegw/keys/south-2026-11.key"]

[log]
# level = "info"
# format = "text"             # text | json

# The fleet's topics (static topology; the metadata server replaces this).
[[topics]]
name = "telemetry"
home = "{region}"
partitions = 4
subscribers = []              # regions that mirror it, or ["*"]
"""
