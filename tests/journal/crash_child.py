"""Child process for the crash tests: appends forever and reports each ack.

Usage: python crash_child.py DIR POLICY SEED

Four concurrent tasks append batches of 1-20 records to partitions of topic
``crash``; the content of every record is a function of (partition, offset),
so the parent can check what survived. After each append returns, the child
prints ``<partition> <first offset> <count>`` and flushes: a line on the pipe
is an acknowledgement.
"""

from __future__ import annotations

import random
import sys

import trio

from edge_gateway.format.batch import encode_batch
from edge_gateway.journal import JournalConfig, open_journal

PARTITIONS = 4


def record_value(partition: int, offset: int) -> bytes:
    rnd = random.Random(partition * 1_000_003 + offset)
    return f"{partition}:{offset}:".encode() + rnd.randbytes(rnd.randrange(0, 300))


async def main(path: str, policy: str, seed: int) -> None:
    cfg = JournalConfig(fsync=policy, segment_bytes=128 * 1024, max_bytes=1 << 30)  # type: ignore[arg-type]
    rnd = random.Random(seed)
    async with open_journal(path, cfg) as j:
        lock = trio.Lock()  # offsets are assigned at append; build the batch under the lock

        async def writer(task: int) -> None:
            while True:
                p = rnd.randrange(PARTITIONS)
                n = rnd.randrange(1, 21)
                async with lock:
                    first = j.next_offset("crash", p)
                    batch = encode_batch(
                        [record_value(p, first + i) for i in range(n)],
                        timestamps=[first + i for i in range(n)],
                    )
                    res = j.append_nowait("crash", p, batch)
                    assert res.base_offset == first
                if policy == "always":
                    await j.wait_durable(res.lsn)
                else:
                    await trio.lowlevel.checkpoint()
                sys.stdout.write(f"{p} {res.base_offset} {res.count}\n")
                sys.stdout.flush()

        async with trio.open_nursery() as nursery:
            for t in range(4):
                nursery.start_soon(writer, t)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
