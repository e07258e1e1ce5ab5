"""AES-256-GCM sealing of log object blocks (sans-IO but for the nonces' randomness).

The layout (which bytes are sealed, what the associated data holds) is defined
in :mod:`edge_gateway.format.logobject` and ``docs/log-object.md``
("Encryption"); this module holds the keys and the AEAD:

* :class:`WriteKey` -- a region's current key (id + 32 bytes). For each
  object it derives a one-object key, ``HKDF-SHA256-Expand(key, info=context)``
  with the object's :func:`~edge_gateway.format.logobject.seal_context`
  (region, key id, epoch, seq, LSN range, block count), and seals each block
  with a random 96-bit nonce. One derived key seals the few blocks of one
  object (a retried seq a few more), so random nonces stay far below the
  2**32 messages NIST allows per GCM key however long a key stays in use.
* :class:`Keyring` -- what a reader holds: per region, the keys by id (the
  current key and older, decrypt-only ones). :meth:`Keyring.opener` raises
  :class:`~edge_gateway.errors.MissingKey` for an id it lacks.

``cryptography`` is an optional dependency (``pip install 'edgegw[encryption]'``),
imported only when a config names keys (:func:`require_cryptography`, at load)
or a key is used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from edge_gateway.errors import ConfigError, MissingKey
from edge_gateway.format.logobject import (
    SEAL_OVERHEAD,
    Buffer,
    LogObjectHeader,
    seal_context,
    valid_key_id,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

#: Bytes of a key (AES-256).
KEY_BYTES: Final = 32
NONCE_BYTES: Final = 12
TAG_BYTES: Final = 16
assert NONCE_BYTES + TAG_BYTES == SEAL_OVERHEAD

_HKDF_PREFIX: Final = b"edgegw log object key v1|"


_NEEDS_CRYPTOGRAPHY: Final = (
    "needs the 'cryptography' package, which is not installed: pip install 'edgegw[encryption]'"
)


def require_cryptography(what: str = "encryption") -> None:
    """Raise :class:`ConfigError` (naming ``what`` and the extra) unless ``cryptography`` imports.

    Called when a config names keys (:class:`~edge_gateway.encryption.EncryptionConfig`),
    so a gateway without the extra stops at load, not at its first sealed object.
    """
    try:
        from cryptography.hazmat.primitives import hashes  # noqa: F401
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: F401
        from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand  # noqa: F401
    except ImportError:
        raise ConfigError(f"{what} {_NEEDS_CRYPTOGRAPHY}") from None


def _aead(key: bytes, context: bytes) -> AESGCM:
    try:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand
    except ImportError:
        raise ConfigError(f"encryption {_NEEDS_CRYPTOGRAPHY}") from None
    derived = HKDFExpand(hashes.SHA256(), KEY_BYTES, _HKDF_PREFIX + context).derive(key)
    return AESGCM(derived)


def check_key(key: object, what: str) -> bytes:
    """``key`` as bytes if it is exactly :data:`KEY_BYTES` long (else :class:`ConfigError`)."""
    if not isinstance(key, bytes | bytearray) or len(key) != KEY_BYTES:
        size = len(key) if isinstance(key, bytes | bytearray) else type(key).__name__
        raise ConfigError(f"{what}: an encryption key is {KEY_BYTES} bytes, got {size}")
    return bytes(key)


def check_key_id(key_id: object, what: str) -> str:
    if not valid_key_id(key_id):
        raise ConfigError(f"{what}: a key id is 1-64 characters of [A-Za-z0-9._-], got {key_id!r}")
    assert isinstance(key_id, str)
    return key_id


class _Sealer:
    __slots__ = ("_aead",)

    def __init__(self, aead: AESGCM) -> None:
        self._aead = aead

    def seal(self, aad: bytes, payload: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, payload, aad)


@dataclass(frozen=True, slots=True)
class WriteKey:
    """A region's current key: blocks of the objects it ships are sealed with it."""

    key_id: str
    key: bytes = field(repr=False)

    def __post_init__(self) -> None:
        check_key_id(self.key_id, "key id")
        check_key(self.key, f"key {self.key_id!r}")

    def sealer(self, context: bytes) -> _Sealer:
        """The sealer of one object (``context``: its ``seal_context``)."""
        return _Sealer(_aead(self.key, context))


@dataclass(frozen=True, slots=True)
class _Opener:
    key_id: str
    context: bytes
    _aead: Any = field(repr=False)

    def open(self, aad: bytes, stored: Buffer) -> bytes | None:
        from cryptography.exceptions import InvalidTag

        data = bytes(stored)
        try:
            out: bytes = self._aead.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], aad)
        except InvalidTag:
            return None
        return out


class Keyring:
    """The keys a reader holds: region -> key id -> key (current and decrypt-only)."""

    def __init__(self, keys: Mapping[str, Mapping[str, bytes]] | None = None) -> None:
        self._keys: dict[str, dict[str, bytes]] = {}
        for region, by_id in (keys or {}).items():
            for key_id, key in by_id.items():
                self.add(region, key_id, key)

    def add(self, region: str, key_id: str, key: bytes) -> None:
        check_key_id(key_id, f"region {region!r}")
        key = check_key(key, f"region {region!r} key {key_id!r}")
        have = self._keys.setdefault(region, {})
        if have.get(key_id, key) != key:
            raise ConfigError(f"region {region!r}: two different keys with the id {key_id!r}")
        have[key_id] = key

    def __bool__(self) -> bool:
        return bool(self._keys)

    def key_ids(self, region: str) -> tuple[str, ...]:
        """The ids of the keys held for ``region`` (never the keys)."""
        return tuple(sorted(self._keys.get(region, {})))

    def regions(self) -> tuple[str, ...]:
        return tuple(sorted(self._keys))

    def opener(
        self,
        region: str,
        key_id: str,
        epoch: int,
        seq: int,
        first_lsn: int,
        last_lsn: int,
        n_blocks: int,
        *,
        where: str | None = None,
    ) -> _Opener:
        """The opener of one encrypted object (:class:`MissingKey` without its key)."""
        key = self._keys.get(region, {}).get(key_id)
        if key is None:
            raise MissingKey(region, key_id, where=where)
        context = seal_context(region, key_id, epoch, seq, first_lsn, last_lsn, n_blocks)
        return _Opener(key_id, context, _aead(key, context))

    def header_opener(self, header: LogObjectHeader, *, where: str | None = None) -> _Opener | None:
        """The opener for an object with ``header`` (None when it is not encrypted)."""
        if header.key_id is None:
            return None
        return self.opener(
            header.region,
            header.key_id,
            header.epoch,
            header.seq,
            header.first_lsn,
            header.last_lsn,
            len(header.blocks),
            where=where,
        )


def generate_key() -> bytes:
    """A new random key of :data:`KEY_BYTES`."""
    return os.urandom(KEY_BYTES)
