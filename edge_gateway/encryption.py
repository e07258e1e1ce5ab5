"""The ``[encryption]`` section: which keys a gateway seals and opens log objects with.

Keys are never in the configuration itself: it names files (32 raw bytes,
``edgegw encryption keygen`` writes one) or an environment variable (64 hex
digits). A key's id is the file's name without its suffix
(``/etc/edgegw/keys/north-2026-11.key`` is ``north-2026-11``) unless
``key_id`` says otherwise for the write key::

    [encryption]
    key_file = "/etc/edgegw/keys/north-2026-11.key"      # or key_env + key_id
    decrypt_keys = ["/etc/edgegw/keys/north-2026-05.key"] # older keys of this region

    [encryption.sources.south]                           # keys of a region mirrored here
    key_files = ["/etc/edgegw/keys/south-2026-11.key"]

A key file must belong to the user running edgegw and give no permission to
others (mode ``0600`` or ``0640``): a key readable by every user of the
device is refused, not warned about (``docs/security.md``). The crypto is in
:mod:`edge_gateway.format.crypt`; the layout in ``docs/log-object.md``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_gateway.errors import ConfigError, InvalidName
from edge_gateway.format.crypt import (
    KEY_BYTES,
    Keyring,
    WriteKey,
    check_key_id,
    require_cryptography,
)
from edge_gateway.names import validate_region

__all__ = [
    "EncryptionConfig",
    "Keys",
    "key_id_of",
    "parse_encryption",
    "read_key_file",
    "write_key_file",
]

#: The suffix ``edgegw encryption keygen`` gives key files (not required).
KEY_SUFFIX = ".key"


@dataclass(frozen=True, slots=True)
class EncryptionConfig:
    """``[encryption]``: off unless ``key_file`` or ``key_env`` is set."""

    #: The region's write key: a file of 32 bytes ...
    key_file: str = ""
    #: ... or an environment variable holding it as 64 hex digits (then ``key_id`` is required).
    key_env: str = ""
    #: The write key's id, written into every object header; default: the key file's stem.
    key_id: str = ""
    #: Older keys of this region, decrypt-only (objects shipped before a rotation).
    decrypt_keys: tuple[str, ...] = ()
    #: Region -> key files of that region (its current and older keys), for mirroring it.
    sources: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.key_file and self.key_env:
            raise ConfigError("encryption.key_file and encryption.key_env: set one of them")
        if self.key_env and not self.key_id:
            raise ConfigError("encryption.key_id: required with encryption.key_env")
        if self.key_id:
            check_key_id(self.key_id, "encryption.key_id")
        if self.key_id and not self.enabled:
            raise ConfigError("encryption.key_id: set without encryption.key_file or key_env")
        for region in self.sources:
            try:
                validate_region(region)
            except InvalidName as exc:
                raise ConfigError(f"encryption.sources.{region}: {exc}") from None
        if self.enabled or self.decrypt_keys or self.sources:
            # At load, before the gateway touches disk or network: without
            # the extra it would accept writes, then stop at the first object
            # it seals (or the first source object it opens).
            require_cryptography("[encryption]")

    @property
    def enabled(self) -> bool:
        """Whether this gateway seals the objects it ships."""
        return bool(self.key_file or self.key_env)

    def load(self, region: str, env: Mapping[str, str] | None = None) -> Keys:
        """Read every key named here (:class:`ConfigError` naming the key on any problem)."""
        env = os.environ if env is None else env
        ring = Keyring()
        write: WriteKey | None = None
        if self.key_file:
            path = Path(self.key_file)
            key = read_key_file(path, "encryption.key_file")
            write = WriteKey(self.key_id or key_id_of(path, "encryption.key_file"), key)
        elif self.key_env:
            write = WriteKey(self.key_id, _key_from_env(env, self.key_env))
        if write is not None:
            _add(ring, region, write.key_id, write.key, "encryption.key_file")
        for i, name in enumerate(self.decrypt_keys):
            where = f"encryption.decrypt_keys[{i}]"
            path = Path(name)
            _add(ring, region, key_id_of(path, where), read_key_file(path, where), where)
        for source, files in sorted(self.sources.items()):
            for i, name in enumerate(files):
                where = f"encryption.sources.{source}.key_files[{i}]"
                path = Path(name)
                _add(ring, source, key_id_of(path, where), read_key_file(path, where), where)
        return Keys(write, ring)


def _add(ring: Keyring, region: str, key_id: str, key: bytes, where: str) -> None:
    try:
        ring.add(region, key_id, key)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


@dataclass(frozen=True, slots=True)
class Keys:
    """What :meth:`EncryptionConfig.load` read: the write key and every key to open with."""

    write: WriteKey | None
    ring: Keyring


def parse_encryption(table: Mapping[str, Any]) -> EncryptionConfig:
    """``[encryption]`` from TOML (strict: unknown keys and wrong types are ConfigErrors)."""
    known = {"key_file", "key_env", "key_id", "decrypt_keys", "sources"}
    for key in table:
        if key not in known:
            raise ConfigError(f"encryption.{key}: unknown key (known: {', '.join(sorted(known))})")
    kwargs: dict[str, Any] = {}
    for key in ("key_file", "key_env", "key_id"):
        if key in table:
            value = table[key]
            if not isinstance(value, str):
                raise ConfigError(f"encryption.{key}: must be a string, not {value!r}")
            kwargs[key] = value
    if "decrypt_keys" in table:
        kwargs["decrypt_keys"] = _paths(table["decrypt_keys"], "encryption.decrypt_keys")
    if "sources" in table:
        sources = table["sources"]
        if not isinstance(sources, Mapping):
            raise ConfigError("encryption.sources: must be a table ([encryption.sources.<region>])")
        out: dict[str, tuple[str, ...]] = {}
        for region, sub in sources.items():
            where = f"encryption.sources.{region}"
            if not isinstance(sub, Mapping) or set(sub) != {"key_files"}:
                raise ConfigError(f"{where}: must be a table with exactly key_files = [...]")
            out[region] = _paths(sub["key_files"], f"{where}.key_files")
        kwargs["sources"] = out
    return EncryptionConfig(**kwargs)


def _paths(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: must be a list of key file paths")
    return tuple(str(Path(v).expanduser()) for v in value)


def key_id_of(path: Path, where: str) -> str:
    """The id of the key in ``path``: its name without the suffix."""
    return check_key_id(path.stem if path.suffix == KEY_SUFFIX else path.name, where)


def read_key_file(path: Path, where: str) -> bytes:
    """The 32 bytes of a key file, refused if others may read it or it is not a key."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot open key file {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{where}: {path} is not a regular file")
        if st.st_mode & 0o007:
            raise ConfigError(
                f"{where}: key file {path} is accessible to other users "
                f"(mode {stat.S_IMODE(st.st_mode):04o}); chmod 600 it"
            )
        data = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != KEY_BYTES:
        raise ConfigError(
            f"{where}: key file {path} holds {len(data)}{'+' if len(data) > KEY_BYTES else ''} "
            f"bytes; a key is exactly {KEY_BYTES} bytes (edgegw encryption keygen writes one)"
        )
    return data


def _key_from_env(env: Mapping[str, str], name: str) -> bytes:
    value = env.get(name)
    if value is None:
        raise ConfigError(f"encryption.key_env: the environment variable {name} is not set")
    try:
        key = bytes.fromhex(value.strip())
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise ConfigError(
            f"encryption.key_env: {name} must hold a key as {2 * KEY_BYTES} hex digits"
        )
    return key


def write_key_file(path: Path, key: bytes) -> None:
    """Create ``path`` holding ``key``, mode 0600, never overwriting a file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        view = memoryview(key)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def keyring_from_files(files: Iterable[tuple[str, str]]) -> Keyring:
    """A keyring from ``(region, key file)`` pairs (the pipeline's and inspect's ``--key-file``)."""
    ring = Keyring()
    for region, name in files:
        where = f"key file for region {region!r}"
        try:
            validate_region(region)
        except InvalidName as exc:
            raise ConfigError(f"{where}: {exc}") from None
        path = Path(name)
        _add(ring, region, key_id_of(path, where), read_key_file(path, where), where)
    return ring


def parse_key_file_options(values: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``REGION=PATH`` command-line values as ``(region, path)`` pairs."""
    out = []
    for value in values:
        region, eq, path = value.partition("=")
        if not eq or not region or not path:
            raise ConfigError(f"--key-file {value!r}: expected REGION=PATH")
        out.append((region, str(Path(path).expanduser())))
    return tuple(out)
