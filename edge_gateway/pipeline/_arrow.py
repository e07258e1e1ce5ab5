"""Record batches of a log-object block as one Arrow record batch (runs in Spark workers).

The batch format is columnar (``docs/format.md``), so the Arrow columns are
built from the decoded batches' raw bytes with numpy, without one Python
object per record: lengths become Arrow offsets by a cumulative sum and the
value bytes are joined once per block.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pyarrow as pa

from edge_gateway.format import logobject
from edge_gateway.format.batch import (
    FLAG_HEADERS,
    FLAG_KEYS,
    FLAG_NULLS,
    HEADER_SIZE,
    RecordBatch,
)
from edge_gateway.pipeline.plan import slice_opener

if TYPE_CHECKING:
    from edge_gateway.bucket import SyncBucket
    from edge_gateway.format.crypt import Keyring
    from edge_gateway.pipeline.plan import ObjectSlice

HEADER_TYPE: Final = pa.struct([("key", pa.string()), ("value", pa.binary())])
TIMESTAMP_TYPE: Final = pa.timestamp("us", tz="UTC")
#: The rows of the ``edgegw`` data source, as Arrow (see ``source.SCHEMA_DDL``).
SCHEMA: Final = pa.schema(
    [
        ("region", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", TIMESTAMP_TYPE),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(HEADER_TYPE)),
        ("log_seq", pa.int64()),
    ]
)


def from_numpy(values: Any) -> pa.Array:
    """An Arrow array of a 1-d numpy array of integers, without copying.

    ``pa.array`` would do, but its first call imports pandas (half a second
    in every fresh Spark worker); this builds the array from the buffer.
    """
    data = np.ascontiguousarray(values)
    return pa.Array.from_buffers(
        pa.from_numpy_dtype(data.dtype), len(data), [None, pa.py_buffer(data)]
    )


def _offsets(lengths: Any) -> Any:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    if out[-1] > np.iinfo(np.int32).max:
        raise OverflowError("more than 2 GiB of bytes in one block column")
    return out.astype(np.int32)


def _repeat_string(text: str, n: int) -> pa.Array:
    raw = text.encode("utf-8")
    offsets = (np.arange(n + 1, dtype=np.int64) * len(raw)).astype(np.int32)
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)]
    )


def _nullable_binary(lengths: Any, data: list[memoryview], n_rows: int) -> pa.Array:
    """A binary column of lengths where -1 is null (SQL NULL), the bytes joined once."""
    valid = lengths >= 0
    return pa.Array.from_buffers(
        pa.binary(),
        n_rows,
        [
            None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little")),
            pa.py_buffer(_offsets(np.maximum(lengths, 0))),
            pa.py_buffer(b"".join(data)),
        ],
    )


def block_to_arrow(
    region: str, topic: str, partition: int, log_seq: int, batches: Iterable[RecordBatch]
) -> pa.RecordBatch:
    """One Arrow record batch (schema :data:`SCHEMA`) of a block's decoded batches."""
    ts_parts: list[Any] = []
    offset_parts: list[Any] = []
    key_lens: list[Any] = []
    key_data: list[memoryview] = []
    value_lens: list[Any] = []
    value_data: list[memoryview] = []
    headers: list[list[dict[str, object]]] = []
    any_keys = any_headers = any_null_values = False
    counts: list[int] = []
    batch_list = list(batches)
    any_headers = any(b.header.flags & FLAG_HEADERS for b in batch_list)
    for b in batch_list:
        h, raw, n = b.header, b.raw, b.header.count
        view = memoryview(raw)
        cur = HEADER_SIZE
        ts_parts.append(np.frombuffer(raw, "<i8", n, cur))
        cur += 8 * n
        offset_parts.append(np.arange(h.base_offset, h.base_offset + n, dtype=np.int64))
        kl = None
        if h.flags & FLAG_KEYS:
            kl = np.frombuffer(raw, "<i4", n, cur)
            cur += 4 * n
            any_keys = True
        vl = np.frombuffer(raw, "<i4", n, cur)
        cur += 4 * n
        if h.flags & FLAG_HEADERS:
            cur += 4 * n
        if kl is None:
            kl = np.full(n, -1, dtype=np.int32)
            key_total = 0
        else:
            key_total = int(np.maximum(kl, 0).sum())
        key_lens.append(kl)
        key_data.append(view[cur : cur + key_total])
        cur += key_total
        if h.flags & FLAG_NULLS:  # a value length may be -1: a null value
            any_null_values = True
            value_total = int(np.maximum(vl, 0).sum())
        else:
            value_total = int(vl.sum())
        value_lens.append(vl)
        value_data.append(view[cur : cur + value_total])
        if any_headers:
            headers.extend([{"key": k, "value": v} for k, v in hs] for hs in b.headers)
        counts.append(n)
    n_rows = sum(counts)
    ts_ms = np.concatenate(ts_parts) if ts_parts else np.zeros(0, np.int64)
    timestamps = pa.Array.from_buffers(
        TIMESTAMP_TYPE, n_rows, [None, pa.py_buffer(ts_ms.astype(np.int64) * 1000)]
    )
    vls = np.concatenate(value_lens) if value_lens else np.zeros(0, np.int32)
    values = _nullable_binary(vls, value_data, n_rows) if any_null_values else None
    if values is None:
        values = pa.Array.from_buffers(
            pa.binary(),
            n_rows,
            [None, pa.py_buffer(_offsets(vls)), pa.py_buffer(b"".join(value_data))],
        )
    if any_keys:
        keys = _nullable_binary(np.concatenate(key_lens), key_data, n_rows)
    else:
        keys = pa.nulls(n_rows, pa.binary())
    if any_headers:
        header_col = pa.array(headers, type=pa.list_(HEADER_TYPE))
    else:
        header_col = pa.ListArray.from_arrays(
            from_numpy(np.zeros(n_rows + 1, dtype=np.int32)), pa.nulls(0, HEADER_TYPE)
        )
    return pa.RecordBatch.from_arrays(
        [
            _repeat_string(region, n_rows),
            _repeat_string(topic, n_rows),
            from_numpy(np.full(n_rows, partition, dtype=np.int32)),
            from_numpy(np.concatenate(offset_parts) if offset_parts else np.zeros(0, np.int64)),
            timestamps,
            keys,
            values,
            header_col,
            from_numpy(np.full(n_rows, log_seq, dtype=np.int64)),
        ],
        schema=SCHEMA,
    )


def read_blocks(
    bucket: SyncBucket,
    slices: Sequence[ObjectSlice],
    *,
    verify: bool = True,
    keyring: Keyring | None = None,
) -> Iterator[pa.RecordBatch]:
    """Arrow record batches of the slices' records, one per block, in slice order.

    Fetches each object's wanted byte ranges (coalesced by
    :func:`logobject.plan_ranges`), checks every block's CRC, decompresses it
    and checks its batches with the gateway's own sans-IO code. Encrypted
    objects are opened with ``keyring`` (:class:`MissingKey` without their key).
    """
    for s in slices:
        opener = slice_opener(s, keyring)
        ranges = logobject.plan_ranges(s, lambda _t, _p: True)
        fetched = [(start, bucket.get(s.key, start=start, end=stop).data) for start, stop in ranges]
        for b in s.blocks:
            stored = logobject.slice_block(b, fetched, where=s.key)
            raw = logobject.decode_block(b, stored, where=s.key, opener=opener)
            batches = logobject.iter_block_batches(b, raw, where=s.key, verify=verify)
            yield block_to_arrow(s.region, b.topic, b.partition, s.seq, batches)
