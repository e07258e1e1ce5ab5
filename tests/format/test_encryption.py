"""Encrypted log objects (``FLAG_ENCRYPTED``): round trips, keys, and an attacker's edits.

``docs/log-object.md`` ("Encryption") is the spec. An attacker here holds the
bucket, not the keys: they may rewrite any byte and recompute every CRC
(:func:`forge`), so only the AES-GCM tags stand between them and the reader.
Every forged object must fail with :class:`CorruptData` (the reader's
quarantine path), never decode to other records and never raise anything else.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_gateway.config import parse_config
from edge_gateway.encryption import keyring_from_files, parse_key_file_options, write_key_file
from edge_gateway.errors import ConfigError, CorruptData, InvalidInput, MissingKey
from edge_gateway.format import crypt
from edge_gateway.format.batch import Record, encode_records
from edge_gateway.format.crypt import Keyring, WriteKey
from edge_gateway.format.logobject import (
    CODEC_NONE,
    CODEC_ZSTD,
    FLAG_ENCRYPTED,
    SEAL_OVERHEAD,
    LaneRange,
    LogObjectBuilder,
    LogObjectHeader,
    decode_block,
    decode_header,
    encode_header,
    header_length_hint,
    iter_block_batches,
    slice_block,
)
from edge_gateway.format.manifest import Manifest, ManifestEntry

KEY = "regions/north/log/00000000000000000007.egw"
K1 = bytes(range(32))
K2 = bytes(range(100, 132))
MARKER = b"PLAINTEXT-MARKER-4711"
#: A value that does not compress.
NOISE = random.Random(1).randbytes(300)


def records_of(topic: str, partition: int, n: int, base: int = 0) -> list[Record]:
    return [
        Record(base + i, 1_000 + i, None, MARKER + b" %s/%d #%d" % (topic.encode(), partition, i))
        for i in range(n)
    ]


def build(
    region: str = "north",
    seq: int = 7,
    key: WriteKey | None = None,
    *,
    epoch: int = 3,
    first_lsn: int = 11,
    last_lsn: int = 14,
    lanes: Sequence[LaneRange] = (),
    incompressible: bool = False,
) -> bytes:
    """Three blocks: two partitions of ``orders`` (one compressible) and one of ``telemetry``."""
    b = LogObjectBuilder()
    b.add_batch("orders", 0, encode_records(records_of("orders", 0, 20)))
    b.add_batch("orders", 1, encode_records([Record(0, 5, None, NOISE)]))
    values = [bytes([i * 7 % 256]) * 3 + MARKER for i in range(5)]
    if incompressible:
        values = [bytes(range(i, i + 60)) + MARKER for i in range(5)]
    b.add_batch(
        "telemetry",
        2,
        encode_records([Record(100 + i, 7 + i, None, v) for i, v in enumerate(values)]),
    )
    return b.build(region, epoch, seq, first_lsn, last_lsn, 1_700_000_000_123, key=key, lanes=lanes)


def read_all(obj: bytes, ring: Keyring, where: str = KEY) -> dict[tuple[str, int], list[bytes]]:
    h = decode_header(obj, where=where, object_size=len(obj))
    opener = ring.header_opener(h, where=where)
    out: dict[tuple[str, int], list[bytes]] = {}
    for b in h.blocks:
        raw = decode_block(b, slice_block(b, [(0, obj)], where=where), where=where, opener=opener)
        for batch in iter_block_batches(b, raw, where=where):
            out.setdefault((b.topic, b.partition), []).extend(r.value for r in batch.records())
    return out


def ring(*keys: tuple[str, str, bytes]) -> Keyring:
    r = Keyring()
    for region, key_id, key in keys:
        r.add(region, key_id, key)
    return r


def forge(obj: bytes, edit: Callable[[LogObjectHeader, bytearray], LogObjectHeader]) -> bytes:
    """``obj`` after an edit of its blocks (``bytearray`` of the bytes after the header)
    and header, with every CRC recomputed as an attacker with bucket access would."""
    import crc32c

    h = decode_header(obj, where=KEY)
    body = bytearray(obj[h.header_length :])
    h2 = edit(h, body)
    blocks = tuple(
        dataclasses.replace(
            b,
            crc=crc32c.crc32c(bytes(body[b.offset - h2.header_length : b.end - h2.header_length])),
        )
        for b in h2.blocks
    )
    return encode_header(dataclasses.replace(h2, blocks=blocks)) + bytes(body)


# --------------------------------------------------------------------------
# round trips and layout


def test_round_trip_hides_the_payload() -> None:
    plain = build()
    sealed = build(key=WriteKey("north-1", K1))
    assert MARKER in plain
    assert MARKER not in sealed
    h = decode_header(sealed, where=KEY, object_size=len(sealed))
    p = decode_header(plain, where=KEY, object_size=len(plain))
    assert (h.flags, h.key_id, h.version) == (FLAG_ENCRYPTED, "north-1", 1)
    # Same index but for stored sizes (+28 each), positions and CRCs; the header
    # grows by the key id (u8 length + 7 bytes).
    assert h.header_length == p.header_length + 1 + len("north-1")
    for a, b in zip(h.blocks, p.blocks, strict=True):
        assert a.stored_length == b.stored_length + SEAL_OVERHEAD
        assert (a.topic, a.partition, a.first_offset, a.last_offset, a.codec, a.raw_length) == (
            b.topic,
            b.partition,
            b.first_offset,
            b.last_offset,
            b.codec,
            b.raw_length,
        )
    assert {b.codec for b in h.blocks} == {CODEC_ZSTD}
    assert read_all(sealed, ring(("north", "north-1", K1))) == read_all(plain, Keyring())


def test_nonces_are_random_but_both_objects_read() -> None:
    k = WriteKey("north-1", K1)
    a, b = build(key=k), build(key=k)
    assert a != b
    assert len(a) == len(b)
    keys = ring(("north", "north-1", K1))
    assert read_all(a, keys) == read_all(b, keys)


def test_lanes_and_encryption_together() -> None:
    lanes = (LaneRange(1, 3, 4), LaneRange(2, 1, 0))
    obj = build(key=WriteKey("k", K1), lanes=lanes)
    h = decode_header(obj, where=KEY, object_size=len(obj))
    assert (h.version, h.lanes, h.key_id) == (2, lanes, "k")
    assert read_all(obj, ring(("north", "k", K1)))[("orders", 1)] == [NOISE]


def test_header_in_pieces_and_the_prefix_hint() -> None:
    obj = build(key=WriteKey("north-1", K1))
    h = decode_header(obj, where=KEY)
    assert header_length_hint(obj[:12]) == h.header_length
    for n in range(h.header_length):
        with pytest.raises(CorruptData):
            decode_header(obj[:n], where=KEY)


def test_fences_and_empty_entries_are_never_encrypted() -> None:
    empty = LogObjectBuilder().build("north", 1, 2, 5, 4, 0, key=WriteKey("k", K1))
    h = decode_header(empty, where=KEY)
    assert (h.flags, h.key_id) == (0, None)


def test_old_objects_still_read_with_a_keyring() -> None:
    """Plaintext objects (versions 1 and 2) need no key and ignore the keyring."""
    for obj in (build(), build(lanes=(LaneRange(1, 1, 2),))):
        assert read_all(obj, ring(("north", "k", K1)))[("orders", 1)] == [NOISE]


def test_flag_without_key_id_and_key_id_without_flag_are_refused() -> None:
    obj = build(key=WriteKey("k", K1))
    h = decode_header(obj, where=KEY)
    with pytest.raises(InvalidInput, match="key id without"):
        encode_header(dataclasses.replace(h, flags=0))
    with pytest.raises(InvalidInput, match="bad key id"):
        encode_header(dataclasses.replace(h, key_id=None))
    with pytest.raises(InvalidInput, match="bad key id"):
        encode_header(dataclasses.replace(h, key_id="a/b"))


def test_sizes_of_sealed_blocks_are_checked() -> None:
    obj = build(key=WriteKey("k", K1))
    h = decode_header(obj, where=KEY)
    raw0 = h.blocks[0]
    bad = dataclasses.replace(raw0, codec=CODEC_NONE, stored_length=raw0.raw_length)
    blocks = tuple(bad if b is raw0 else b for b in h.blocks)
    with pytest.raises(InvalidInput, match=r"stored_length != raw_length \+ 28"):
        encode_header(dataclasses.replace(h, blocks=blocks))


# --------------------------------------------------------------------------
# keys


def test_wrong_key_is_corrupt_data() -> None:
    obj = build(key=WriteKey("north-1", K1))
    with pytest.raises(CorruptData, match="authentication failed"):
        read_all(obj, ring(("north", "north-1", K2)))


def test_missing_key_names_region_and_id() -> None:
    obj = build(key=WriteKey("north-1", K1))
    for keys in (Keyring(), ring(("north", "north-0", K1)), ring(("south", "north-1", K1))):
        with pytest.raises(MissingKey) as info:
            read_all(obj, keys)
        assert (info.value.region, info.value.key_id) == ("north", "north-1")
        assert "[encryption.sources.north]" in info.value.action


def test_rotated_key_old_objects_stay_readable() -> None:
    old = build(seq=7, key=WriteKey("north-1", K1))
    new = build(seq=8, key=WriteKey("north-2", K2), first_lsn=15, last_lsn=18)
    both = ring(("north", "north-1", K1), ("north", "north-2", K2))
    assert read_all(old, both) == read_all(new, both)
    with pytest.raises(MissingKey):
        read_all(old, ring(("north", "north-2", K2)))


def test_keyring_refuses_bad_keys() -> None:
    with pytest.raises(ConfigError, match="32 bytes, got 31"):
        Keyring({"north": {"k": bytes(31)}})
    with pytest.raises(ConfigError, match="key id"):
        Keyring({"north": {"": K1}})
    with pytest.raises(ConfigError, match="two different keys"):
        ring(("north", "k", K1), ("north", "k", K2))
    with pytest.raises(ConfigError, match="32 bytes"):
        WriteKey("k", b"short")


# --------------------------------------------------------------------------
# an attacker with the bucket but no key


def _flip(
    pos_in_block: int, block: int = 0
) -> Callable[[LogObjectHeader, bytearray], LogObjectHeader]:
    def edit(h: LogObjectHeader, body: bytearray) -> LogObjectHeader:
        b = h.blocks[block]
        body[b.offset - h.header_length + pos_in_block] ^= 0x01
        return h

    return edit


@pytest.mark.parametrize("where", ["nonce", "ciphertext", "tag"])
def test_tampered_block_fails_authentication(where: str) -> None:
    obj = build(key=WriteKey("k", K1))
    h = decode_header(obj, where=KEY)
    pos = {"nonce": 3, "ciphertext": 20, "tag": h.blocks[0].stored_length - 2}[where]
    keys = ring(("north", "k", K1))
    # Without fixing the CRC: caught by the CRC before any decryption.
    raw = bytearray(obj)
    raw[h.blocks[0].offset + pos] ^= 1
    with pytest.raises(CorruptData, match="CRC mismatch"):
        read_all(bytes(raw), keys)
    # With the CRC recomputed: caught by the tag.
    with pytest.raises(CorruptData, match="authentication failed"):
        read_all(forge(obj, _flip(pos)), keys)


def _swap_blocks(src: bytes, dst: bytes, i: int, j: int) -> bytes:
    """``dst`` with its block ``j`` replaced by ``src``'s block ``i`` (same size)."""
    hs = decode_header(src, where=KEY)
    a = hs.blocks[i]
    piece = src[a.offset : a.end]

    def edit(h: LogObjectHeader, body: bytearray) -> LogObjectHeader:
        b = h.blocks[j]
        assert b.stored_length == len(piece), "choose blocks of one size"
        body[b.offset - h.header_length : b.end - h.header_length] = piece
        return h

    return forge(dst, edit)


def test_block_swapped_between_objects_of_one_region() -> None:
    k = WriteKey("k", K1)
    a = build(seq=7, key=k)
    b = build(seq=8, key=k, first_lsn=15, last_lsn=18)
    keys = ring(("north", "k", K1))
    for n in range(3):
        with pytest.raises(CorruptData, match="authentication failed"):
            read_all(_swap_blocks(a, b, n, n), keys)


def test_block_swapped_between_regions_with_one_key() -> None:
    """Even a key shared by two regions (a mistake) does not let blocks move between them."""
    k = WriteKey("k", K1)
    north = build("north", key=k)
    south = build("south", key=k)
    keys = ring(("north", "k", K1), ("south", "k", K1))
    with pytest.raises(CorruptData, match="authentication failed"):
        read_all(_swap_blocks(north, south, 0, 0), keys, where="south")


def test_blocks_swapped_within_an_object() -> None:
    """Two blocks of one size trade places: each is bound to its own position and row."""
    b = LogObjectBuilder()
    same = encode_records(records_of("t", 0, 10))
    b.add_batch("t", 0, same)
    b.add_batch("t", 1, same)  # the same bytes: blocks of the same size
    obj = b.build("north", 3, 7, 11, 14, 0, key=WriteKey("k", K1))
    keys = ring(("north", "k", K1))
    assert read_all(obj, keys)[("t", 1)] == read_all(obj, keys)[("t", 0)]

    def swap(h: LogObjectHeader, body: bytearray) -> LogObjectHeader:
        x, y = (slice(b.offset - h.header_length, b.end - h.header_length) for b in h.blocks)
        assert x.stop - x.start == y.stop - y.start
        body[x], body[y] = bytes(body[y]), bytes(body[x])
        return h

    with pytest.raises(CorruptData, match="authentication failed"):
        read_all(forge(obj, swap), keys)
    # forge() without an edit keeps an object readable: the failures above are the tags'.
    assert read_all(forge(obj, lambda h, body: h), keys) == read_all(obj, keys)


def test_header_fields_are_bound_to_the_blocks() -> None:
    """Rewriting the object's coordinates in its header fails every block's tag."""
    obj = build(key=WriteKey("k", K1))
    keys = ring(("north", "k", K1))

    def shift_lsns(h: LogObjectHeader, body: bytearray) -> LogObjectHeader:
        return dataclasses.replace(h, first_lsn=h.first_lsn + 1)

    def other_epoch(h: LogObjectHeader, body: bytearray) -> LogObjectHeader:
        return dataclasses.replace(h, epoch=h.epoch + 1)

    def other_seq(h: LogObjectHeader, body: bytearray) -> LogObjectHeader:
        return dataclasses.replace(h, seq=h.seq + 1)

    def drop_last(h: LogObjectHeader, body: bytearray) -> LogObjectHeader:
        last = h.blocks[-1]
        del body[last.offset - h.header_length :]
        shorter = dataclasses.replace(h, blocks=h.blocks[:-1])
        size = h.header_length - (63 + len(last.topic))
        shift = h.header_length - size
        blocks = tuple(dataclasses.replace(b, offset=b.offset - shift) for b in shorter.blocks)
        return dataclasses.replace(shorter, header_length=size, blocks=blocks)

    for edit_header in (shift_lsns, other_epoch, other_seq, drop_last):
        with pytest.raises(CorruptData, match="authentication failed"):
            read_all(forge(obj, edit_header), keys)


def test_index_claims_are_bound_to_the_block() -> None:
    """Rewriting what an index row says a block holds (timestamps) fails the tag."""
    obj = build(key=WriteKey("k", K1))
    keys = ring(("north", "k", K1))

    def shift_ts(h: LogObjectHeader, body: bytearray) -> LogObjectHeader:
        b = h.blocks[0]
        moved = dataclasses.replace(b, min_ts=b.min_ts - 1)
        return dataclasses.replace(h, blocks=(moved, *h.blocks[1:]))

    with pytest.raises(CorruptData, match="authentication failed"):
        read_all(forge(obj, shift_ts), keys)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_forged_byte_is_corrupt_data_never_other_records(data: st.DataObject) -> None:
    obj = build(key=WriteKey("k", K1))
    h = decode_header(obj, where=KEY)
    block = data.draw(st.integers(0, len(h.blocks) - 1))
    pos = data.draw(st.integers(0, h.blocks[block].stored_length - 1))
    keys = ring(("north", "k", K1))
    try:
        read_all(forge(obj, _flip(pos, block)), keys)
    except CorruptData:
        return
    pytest.fail("a forged block decoded")


# --------------------------------------------------------------------------
# manifests


def test_manifest_entries_carry_the_key_id() -> None:
    obj = build(key=WriteKey("north-1", K1))
    h = decode_header(obj, where=KEY, object_size=len(obj))
    entry = ManifestEntry.from_header(h, len(obj))
    assert entry.key_id == "north-1"
    assert entry.to_header("north", h.created_ms) == h
    m = Manifest(
        "north", 3, 7, 7, 1, 0, (entry,), {(b.topic, b.partition): b.next_offset for b in h.blocks}
    )
    doc = m.encode()
    assert b'"version":3' in doc
    assert b'"key_id":"north-1"' in doc
    assert MARKER not in doc
    back = Manifest.decode(doc, where="m", region="north", last_seq=7)
    assert back.entries == (entry,)
    # A plaintext entry keeps version 1, byte for byte.
    p = build()
    ph = decode_header(p, where=KEY)
    plain = Manifest(
        "north",
        3,
        7,
        7,
        1,
        0,
        (ManifestEntry.from_header(ph, len(p)),),
        {(b.topic, b.partition): b.next_offset for b in ph.blocks},
    )
    assert b'"version":1' in plain.encode()
    # A bad key id in a manifest is corrupt.
    with pytest.raises(CorruptData, match="key_id"):
        Manifest.decode(doc.replace(b'"north-1"', b'"no/rth"'), where="m")


# --------------------------------------------------------------------------
# key files and [encryption]


def _key_file(path: Path, key: bytes = K1, mode: int = 0o600) -> Path:
    write_key_file(path, key)
    path.chmod(mode)
    return path


def test_config_loads_keys_by_file_name(tmp_path: Path) -> None:
    write = _key_file(tmp_path / "north-2026-11.key")
    old = _key_file(tmp_path / "north-2026-05.key", K2)
    south = _key_file(tmp_path / "south-1.key", K2, 0o640)
    cfg = parse_config(
        {
            "region": "north",
            "encryption": {
                "key_file": str(write),
                "decrypt_keys": [str(old)],
                "sources": {"south": {"key_files": [str(south)]}},
            },
        }
    )
    keys = cfg.encryption.load("north", env={})
    assert keys.write is not None
    assert keys.write.key_id == "north-2026-11"
    assert keys.ring.key_ids("north") == ("north-2026-05", "north-2026-11")
    assert keys.ring.key_ids("south") == ("south-1",)
    assert "key=" not in repr(keys.write)  # the key never shows in a repr


def test_config_from_env_and_its_errors(tmp_path: Path) -> None:
    cfg = parse_config(
        {"region": "north", "encryption": {"key_env": "EDGEGW_NORTH_KEY", "key_id": "n1"}},
        env={"EDGEGW_NORTH_KEY": K1.hex()},
    )
    keys = cfg.encryption.load("north", env={"EDGEGW_NORTH_KEY": K1.hex()})
    assert keys.write == WriteKey("n1", K1)
    with pytest.raises(ConfigError, match="64 hex digits"):
        cfg.encryption.load("north", env={"EDGEGW_NORTH_KEY": "abc"})
    with pytest.raises(ConfigError, match="is not set"):
        cfg.encryption.load("north", env={})
    bad: list[tuple[dict[str, object], str]] = [
        ({"key_env": "X"}, "key_id: required"),
        ({"key_file": "a", "key_env": "X", "key_id": "k"}, "set one of them"),
        ({"key_id": "k"}, "without encryption.key_file"),
        ({"key": "secret"}, "encryption.key: unknown key"),
        ({"key_file": "a", "key_id": "bad id"}, "key id"),
        ({"sources": {"south": {"key_file": "a"}}}, "exactly key_files"),
        ({"sources": {"../x": {"key_files": ["a"]}}}, "encryption.sources"),
        ({"decrypt_keys": "a"}, "list of key file paths"),
    ]
    for table, message in bad:
        with pytest.raises(ConfigError, match=message):
            parse_config({"region": "north", "encryption": table})


def test_key_file_problems_are_config_errors(tmp_path: Path) -> None:
    short = tmp_path / "short.key"
    short.write_bytes(b"x" * 31)
    short.chmod(0o600)
    long = tmp_path / "long.key"
    long.write_bytes(b"x" * 33)
    long.chmod(0o600)
    exposed = _key_file(tmp_path / "exposed.key", mode=0o644)
    cases = [
        (short, "holds 31 bytes"),
        (long, "holds 33\\+ bytes"),
        (exposed, "accessible to other users \\(mode 0644\\)"),
        (tmp_path / "missing.key", "cannot open key file"),
        (tmp_path, "not a regular file"),
    ]
    for path, message in cases:
        with pytest.raises(ConfigError, match=message):
            keyring_from_files([("north", str(path))])
    with pytest.raises(FileExistsError):
        write_key_file(exposed, K1)
    assert (tmp_path / "fresh.key").exists() is False
    _key_file(tmp_path / "fresh.key")
    assert (tmp_path / "fresh.key").stat().st_mode & 0o777 == 0o600


def test_key_file_options() -> None:
    assert parse_key_file_options(["north=/k/n.key"]) == (("north", "/k/n.key"),)
    with pytest.raises(ConfigError, match="REGION=PATH"):
        parse_key_file_options(["/k/n.key"])


def test_generated_keys_differ() -> None:
    assert crypt.generate_key() != crypt.generate_key()
    assert len(crypt.generate_key()) == crypt.KEY_BYTES


def test_a_reader_from_before_encryption_refuses_sealed_objects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The previous reader knew only the FENCE flag: it refuses bit 1 at the first 12 bytes."""
    from edge_gateway.format import logobject

    sealed = build(key=WriteKey("k", K1))
    plain = build()
    monkeypatch.setattr(logobject, "_KNOWN_FLAGS", logobject.FLAG_FENCE)
    with pytest.raises(CorruptData, match="unknown flags 0x02"):
        header_length_hint(sealed[:12])
    with pytest.raises(CorruptData, match="unknown flags 0x02"):
        decode_header(sealed, where=KEY)
    assert decode_header(plain, where=KEY).key_id is None  # and reads plaintext as before
