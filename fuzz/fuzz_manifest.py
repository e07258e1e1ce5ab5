"""Fuzz the manifest decoder (``edge_gateway.format.manifest``).

The property: for any bytes, ``Manifest.decode`` either returns a manifest or
raises ``CorruptData``; nothing else escapes, and a manifest it accepts
encodes and decodes again to the same manifest.

With atheris installed this is a libFuzzer target::

    python fuzz/fuzz_manifest.py -max_total_time=60

Without it, a plain mutation loop runs over a seed corpus of valid manifests::

    python fuzz/fuzz_manifest.py [iterations] [seed]

The first input byte picks a mode: with bit 0 set the rest is parsed as JSON
(when it is) and one value in it is replaced by a hostile one, so mutations
reach the checks behind the JSON syntax, which random byte flips rarely do.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

from edge_gateway.errors import CorruptData
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.crypt import WriteKey
from edge_gateway.format.logobject import (
    LaneRange,
    LogObjectBuilder,
    decode_header,
    encode_fence,
)
from edge_gateway.format.manifest import Manifest, ManifestEntry

sys.path.insert(0, str(Path(__file__).parent))
import _harness

KEY = "regions/north/manifest/00000000000000000003.json"
HOSTILE: list[Any] = [
    None, True, False, 0, -1, 1, 2**32, 2**63, 2**64, -(2**63) - 1, 10**30, "", "north",
    "a/b", "t", [], {}, [[]], [0] * 12, ["t", 0, 0, 0, 1, 0, 0, 67, 1, 52, 0, 0],
]  # fmt: skip


def _seeds() -> list[bytes]:
    fence = encode_fence("north", 1, 1, 0, 1_700_000_000_000)
    b = LogObjectBuilder(max_block_bytes=100)
    for p in range(3):
        b.add("t", p, [encode_batch([b"v%d" % i] * 3, timestamps=i, base_offset=3 * i)
                       for i in range(3)])  # fmt: skip
    obj = b.build("north", 1, 2, 1, 9, 1_700_000_000_100)
    fence2 = encode_fence("north", 2, 3, 9, 1_700_000_000_200)
    entries = [
        ManifestEntry.from_header(decode_header(o, where="seed"), len(o))
        for o in (fence, obj, fence2)
    ]
    one = Manifest.covering(
        region="north",
        epoch=2,
        entries=entries,
        low_watermark=1,
        created_ms=1_700_000_000_300,
        previous_offsets={("old", 7): 12},
    )
    two = Manifest.covering(
        region="north", epoch=1, entries=entries[:1], low_watermark=1, created_ms=0
    )
    # version 2: log objects with a lane table (lanes 1 and 2 beside lane 0)
    b3 = LogObjectBuilder()
    b3.add("crit", 0, [encode_batch([b"alarm"], timestamps=5)])
    v2 = [
        encode_fence("north", 3, 4, 9, 0, {1: 0, 2: 0}),
        b3.build("north", 3, 5, 10, 9, 0, lanes=(LaneRange(1, 1, 1), LaneRange(2, 1, 0))),
        b.build("north", 3, 6, 10, 18, 0, lanes=(LaneRange(1, 2, 1),)),
    ]
    three = Manifest.covering(
        region="north",
        epoch=3,
        entries=[ManifestEntry.from_header(decode_header(o, where="seed"), len(o)) for o in v2],
        low_watermark=1,
        created_ms=0,
    )
    # version 3: entries of encrypted log objects name their key id
    sealed = b.build("north", 4, 7, 19, 27, 0, key=WriteKey("north-1", bytes(32)))
    four = Manifest.covering(
        region="north",
        epoch=4,
        entries=[ManifestEntry.from_header(decode_header(sealed, where="seed"), len(sealed))],
        low_watermark=1,
        created_ms=0,
    )
    return [one.encode(), two.encode(), three.encode(), four.encode()]


SEEDS = _seeds()


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*path, i))
    return out


def _replace_one(text: bytes, choice: int) -> bytes:
    try:
        doc = json.loads(text)
    except ValueError:
        return text
    paths = [p for p in _paths(doc) if p]
    if not paths:
        return text
    path = paths[choice % len(paths)]
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    value = HOSTILE[(choice // len(paths)) % len(HOSTILE)]
    parent[path[-1]] = value
    return json.dumps(doc).encode()


def fuzz_one_input(data: bytes) -> None:
    if not data:
        return
    mode, buf = data[0], bytes(data[1:])
    if mode & 1:
        buf = _replace_one(buf, mode >> 1)
    try:
        m = Manifest.decode(buf, where=KEY)
    except CorruptData:
        return
    again = Manifest.decode(m.encode(), where=KEY)
    assert again == m, (again, m)


def _mutate(rng: random.Random, data: bytes) -> bytes:
    return _harness.mutate_text(
        rng,
        data,
        alphabet=b'0123456789-.,:[]{}"eE\\',
        tokens=[b"0", b"1", b"-", b".5", b"e9", b"[", b'"', b",1", b"NaN"],
    )


def _mutate_or_hostile(rng: random.Random, data: bytes) -> bytes:
    """Half byte-level mutations, half one hostile JSON value (a new mode byte)."""
    return _mutate(rng, data) if rng.random() < 0.5 else bytes([rng.randrange(256)]) + data[1:]


def _plain_loop(iterations: int, seed: int) -> None:
    _harness.plain_loop(
        "fuzz_manifest",
        fuzz_one_input,
        [bytes([mode]) + s for s in SEEDS for mode in range(0, 256, 7)],
        _mutate_or_hostile,
        iterations,
        seed,
        grow_every=1024,
    )


if __name__ == "__main__":
    _harness.main(fuzz_one_input, _plain_loop)
