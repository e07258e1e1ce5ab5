"""The loop every fuzz harness here shares.

With atheris installed (``pip install atheris``) a harness runs under
libFuzzer's coverage-guided search; without it, a seeded mutation loop over a
small corpus, reproducible from its seed: ``python fuzz/fuzz_X.py [N] [SEED]``.
"""

from __future__ import annotations

import random
import struct
import sys
from collections.abc import Callable, Iterable, Sequence

Mutate = Callable[[random.Random, bytes], bytes]


def plain_loop(
    name: str,
    fuzz_one_input: Callable[[bytes], None],
    corpus: Iterable[bytes],
    mutate: Mutate,
    iterations: int,
    seed: int,
    *,
    grow_every: int = 4096,
) -> None:
    rng = random.Random(seed)
    pool = list(corpus)
    for i in range(iterations):
        data = mutate(rng, rng.choice(pool))
        fuzz_one_input(data)
        if i % grow_every == 0 and len(pool) < 256:
            pool.append(data)
    print(f"{name}: {iterations} inputs, seed {seed}, no unexpected exception")


def mutate_text(
    rng: random.Random,
    data: bytes,
    *,
    alphabet: bytes,
    tokens: Sequence[bytes],
    max_ops: int = 4,
    splice: bool = False,
) -> bytes:
    """1..``max_ops`` edits of text input: flip a bit, overwrite a byte with one of
    ``alphabet``, delete up to 16 bytes, insert one of ``tokens``, and with
    ``splice`` copy a run of up to 40 bytes of the input elsewhere."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, max_ops)):
        op = rng.randrange(5 if splice else 4)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[pos % len(buf)] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:
            buf[pos % len(buf)] = rng.choice(alphabet)
        elif op == 2:
            del buf[pos : pos + rng.randint(1, 16)]
        elif op == 3:
            buf[pos:pos] = rng.choice(tokens)
        else:
            start = rng.randrange(len(buf) + 1)
            buf[pos:pos] = buf[start : start + rng.randint(1, 40)]
    return bytes(buf)


def mutate_binary(
    rng: random.Random,
    data: bytes,
    *,
    ints: Sequence[int],
    formats: Sequence[str],
    max_cut: int | None = None,
) -> bytes:
    """1..4 edits of binary input: flip a bit, overwrite a byte with a boundary
    value, cut the tail (or up to ``max_cut`` bytes), insert 1..8 random bytes,
    or write one of ``ints`` (wrapped to the field) in one of the struct
    ``formats`` over what may be a length, offset or count field."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[pos % len(buf)] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:
            buf[pos % len(buf)] = rng.choice([0, 1, 0x7F, 0x80, 0xFF])
        elif op == 2:
            del buf[pos : None if max_cut is None else pos + rng.randint(1, max_cut)]
        elif op == 3:
            buf[pos:pos] = rng.randbytes(rng.randint(1, 8))
        else:
            fmt = rng.choice(formats)
            size = struct.calcsize(fmt)
            if len(buf) >= size:
                bits = 8 * size
                value = rng.choice(ints) % 2**bits
                if fmt[-1].islower() and value >= 2 ** (bits - 1):
                    value -= 2**bits  # a signed field: the same bits
                struct.pack_into(fmt, buf, rng.randrange(len(buf) - size + 1), value)
    return bytes(buf)


def main(fuzz_one_input: Callable[[bytes], None], loop: Callable[[int, int], None]) -> None:
    try:
        import atheris  # type: ignore[import-not-found]
    except ImportError:
        iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
        seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
        loop(iterations, seed)
        return
    atheris.Setup(sys.argv, fuzz_one_input)
    atheris.Fuzz()
