"""Sans-IO encodings: record batches, journal entries, log objects, manifests.

Nothing here performs I/O; the journal, shipper, tailer, pipeline and fuzzers
all share these functions.
"""

from edge_gateway.format.batch import (
    NEED_DATA,
    BatchHeader,
    BatchReader,
    Record,
    RecordBatch,
    decode_batch,
    encode_batch,
    encode_records,
    iter_batches,
    read_header,
    with_base_offset,
)

__all__ = [
    "NEED_DATA",
    "BatchHeader",
    "BatchReader",
    "Record",
    "RecordBatch",
    "decode_batch",
    "encode_batch",
    "encode_records",
    "iter_batches",
    "read_header",
    "with_base_offset",
]
