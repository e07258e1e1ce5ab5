"""The project's error tree.

Every error edgegw raises on purpose derives from :class:`EdgeGatewayError`.
Foreign exceptions (``struct.error``, ``zstd.ZstdError``, ``botocore`` errors,
``OSError`` from a full disk) are translated at the boundary where they occur,
so callers only ever handle these kinds::

    EdgeGatewayError
    ├── InvalidInput          the caller passed something wrong; do not retry
    │   ├── InvalidName       a topic or region name breaks the naming rules
    │   ├── ConfigError       a configuration key is missing or wrong
    │   ├── UnknownTopic      no such topic here (and auto_create is off)
    │   ├── ReadOnlyTopic     a mirror topic, or a topic homed in another region
    │   │   └── WrongRegion   the topic is homed in another region (``.home``)
    │   ├── UnknownProducer   an idempotent producer id this gateway does not
    │   │                     remember (never issued, or forgotten: idle past
    │   │                     the expiry or evicted); get a new id
    │   └── OutOfOrderSequence  a producer's sequence leaves a gap (or is older
    │                         than the batches remembered); never retried as is
    ├── CorruptData           bytes on disk or in the bucket fail a check
    │   │                     (CRC, length, magic, version, structure)
    │   └── BucketLost        the bucket no longer holds the region's log
    │                         that this gateway committed there; stop, an
    │                         operator recovers (``edgegw reship`` or
    │                         ``edgegw restore``), never retry
    ├── Unavailable           a dependency is away (bucket, metadata server);
    │   │                     retry later with backoff
    │   ├── JournalFull       the journal's disk budget is exhausted; retry
    │   │                     after shipping frees space
    │   ├── DiskFull          the filesystem under the journal is full
    │   │                     (ENOSPC, EDQUOT); retry when space returns
    │   ├── RepairPending     the entries asked for are damaged on disk and
    │   │                     being rebuilt from the bucket; retry shortly
    │   └── Denied            a dependency refuses this gateway (credentials,
    │       │                 policy, a missing bucket, the wrong region or
    │       │                 endpoint): a person must act; keep working
    │       │                 locally and retry with backoff meanwhile
    │       └── MissingKey    an encrypted log object names a key id this
    │                         reader was not given: a person must add the
    │                         key; the other sources go on
    ├── Fenced                another writer claimed this region with a higher
    │   │                     epoch; stop writing, never retry
    │   └── ProducerFenced    an idempotent producer's epoch was bumped by a
    │                         newer instance; this one stops
    ├── InUse                 another process holds the data directory (or the
    │                         journal); never retry while it runs
    └── ClosedError           the resource was closed by its owner

The split follows SlateDB's error kinds (unavailable, invalid, data, fenced,
closed): each tells the caller *what to do*, not what went wrong inside.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge_gateway.datadir import LockHolder


class EdgeGatewayError(Exception):
    """Base class of every error edgegw raises on purpose."""


class InvalidInput(EdgeGatewayError, ValueError):
    """The caller passed something wrong; retrying the same call cannot help."""


class InvalidName(InvalidInput):
    """A topic or region name breaks the naming rules (see ``edge_gateway.names``)."""


class ConfigError(InvalidInput):
    """A configuration key is missing or has a bad value; the message names the key."""


class UnknownTopic(InvalidInput):
    """The topic does not exist on this gateway."""


class ReadOnlyTopic(InvalidInput):
    """Writes were sent to a mirror topic or to a topic homed in another region."""


class WrongRegion(ReadOnlyTopic):
    """Writes were sent to a topic homed in another region; ``home`` names it (when known)."""

    def __init__(self, message: str, home: str | None = None) -> None:
        super().__init__(message)
        self.home = home


class UnknownProducer(InvalidInput):
    """An idempotent produce names a producer id this gateway does not remember.

    Never issued here, or forgotten: idle longer than
    ``idempotence.producer_expiry``, or evicted as the oldest idle when more
    than ``idempotence.max_producers`` are remembered (docs/api.md,
    "Idempotent produce"). The producer gets a new id and starts its
    sequences at 0; what it is retrying may then be written twice, which is
    why the expiry is long.
    """


class OutOfOrderSequence(InvalidInput):
    """An idempotent produce's sequence is not the next one for its partition.

    A gap (records of an earlier request were never acknowledged) or a
    sequence older than the batches the gateway remembers. ``expected`` is
    the sequence the gateway would accept next (None: only 0 after a new
    epoch, or unknown).
    """

    def __init__(self, message: str, *, expected: int | None = None) -> None:
        super().__init__(message)
        self.expected = expected


class CorruptData(EdgeGatewayError):
    """Bytes failed an integrity or structure check.

    ``where`` names the place (a file and byte position, a bucket key, "batch");
    decoders raise only this, never ``struct.error`` or ``IndexError``.
    """

    def __init__(self, message: str, *, where: str | None = None) -> None:
        self.where = where
        self.reason = message
        super().__init__(f"{where}: {message}" if where else message)


class UnsupportedFormat(CorruptData):
    """Well-formed bytes of a format version or flag this reader does not know.

    Written by a newer edgegw, not damaged: a writer never sets such an
    object aside (see ``Shipper``, "set aside"), whereas it may set aside
    other :class:`CorruptData` found where its next entry goes.
    """


class BucketLost(CorruptData):
    """The bucket lost this region's log: its head is below what this gateway committed.

    Raised by the shipper when the log's head is lower than a seq this
    journal's writer saw committed (recorded in ``shipper.json``), when the
    journal deleted segments that the log no longer covers, when a log entry
    not yet summarised by a manifest (which garbage collection never deletes)
    has vanished, or when a local bucket directory lost its layout while in
    use. The bucket was wiped, replaced by an older copy, or the config now
    names another bucket or prefix. Writing on would create a second, different
    log under the same seqs, so the gateway stops (``edgegw serve`` exits 4);
    the message says what was lost and how to recover: ``edgegw reship``
    re-creates the log from the journal when it still holds every entry after
    the bucket's head, otherwise ``edgegw restore``.
    """


class Unavailable(EdgeGatewayError):
    """A dependency is unreachable or overloaded; retry later with backoff."""


class JournalFull(Unavailable):
    """The journal's disk budget is exhausted.

    Nothing already acknowledged is touched; appends succeed again once the
    shipper confirms data and segments can be deleted.
    """


class DiskFull(Unavailable):
    """The filesystem under the journal has no room (``ENOSPC``, ``EDQUOT``).

    Unlike :class:`JournalFull` the budget is not the limit: something else
    filled the disk (or the budget exceeds it). The failed write was undone
    and shipped segments were deleted to make room; appends succeed again as
    soon as space returns, without a restart.
    """


class RepairPending(Unavailable):
    """The entries asked for are damaged on disk and being rebuilt from the bucket.

    The journal found damage in a sealed segment whose entries the bucket
    holds (issue 45): a background repair is under way; retry after
    ``Retry-After`` (docs/api.md, ``repair_pending``).
    """


class Denied(Unavailable):
    """A dependency answers, but refuses this gateway until a person acts.

    Revoked, expired or wrong credentials, a policy that forbids the request,
    a bucket that does not exist, the wrong region or endpoint. Nothing
    local is wrong, so this is handled like :class:`Unavailable` -- intake
    and local reads go on, the request is retried with backoff (new
    credentials or a fixed policy take effect at the next attempt) -- but
    status, metrics and the log say that someone has to fix it.

    ``code`` is the dependency's own name for the refusal (the S3 error
    code, e.g. ``InvalidAccessKeyId``, ``NoSuchBucket``); ``action`` says
    what to do about it.
    """

    def __init__(self, message: str, *, code: str, action: str) -> None:
        self.code = code
        self.action = action
        super().__init__(message)


class MissingKey(Denied):
    """An encrypted log object is sealed with a key this reader does not hold.

    Handled like :class:`Denied`: the reader of that source waits with
    backoff (no retry storm) until the key is configured, says so in status,
    metrics and the log, and the other sources go on. ``region`` and
    ``key_id`` name the key that is missing.
    """

    def __init__(self, region: str, key_id: str, *, where: str | None = None) -> None:
        self.region = region
        self.key_id = key_id
        at = f"{where}: " if where else ""
        super().__init__(
            f"{at}no decryption key {key_id!r} for region {region!r}",
            code="MissingKey",
            action=(
                f"give this reader the key: [encryption.sources.{region}] key_files "
                "(a gateway), or --key-file (the pipeline, edgegw inspect)"
            ),
        )


class Fenced(EdgeGatewayError):
    """Another writer owns this region's log with a higher epoch; stop writing."""


class ProducerFenced(Fenced):
    """An idempotent producer's epoch is older than its id's current epoch.

    A newer instance of the producer called ``init_producer`` with the same
    id, which bumped the epoch: the older one must stop (Kafka's
    ``PRODUCER_FENCED``).
    """


class InUse(EdgeGatewayError):
    """Another process holds a data directory's (or journal's) lock (see ``edge_gateway.datadir``).

    ``holder`` is what that process wrote about itself (``None`` when
    unknown); ``path`` the locked directory.
    """

    def __init__(self, path: object, holder: LockHolder | None) -> None:
        self.path = path
        self.holder = holder
        super().__init__(f"{path} is in use by another edgegw process: {self.holder_text}")

    @property
    def holder_text(self) -> str:
        """``pid 1234 (edgegw serve ... since ...)``, or that it is unknown."""
        if self.holder is None:
            return "a process whose pid is unknown"
        return self.holder.describe()


class ClosedError(EdgeGatewayError):
    """The resource was closed by its owner and can no longer be used."""
