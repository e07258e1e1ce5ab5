"""``edgegw journal expand``: compressed segments back to entry logs, for a downgrade.

docs/operations.md (upgrade order, compressed segments): a gateway from
before compressed segments refuses a journal holding one (``EGWC``), saying
so and changing nothing; ``edgegw journal expand`` turns every compressed
segment back into the very bytes it replaced, after which that older gateway
opens the directory and reads every record. The old gateway is the code of
the last commit before the journal read compressed segments, from git
history (``_old_code.py``). The command refuses while a journal is open.
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio
from _cli_support import run_edgegw

from edge_gateway.format.atrest import MAGIC
from edge_gateway.format.batch import encode_batch
from edge_gateway.journal import Journal, JournalConfig

sys.path.insert(0, str(Path(__file__).parents[1]))
from _old_code import old_sources, run_old

#: The last commit of main before the journal read compressed segments (the merge of
#: d6ee0ec, "journal: read compressed sealed segments (EGWC) on every path").
BEFORE_AT_REST = "1569016339ccd37660b793480ef9d1e681cae89a"

CFG = JournalConfig(segment_bytes=64 * 1024, max_bytes=1 << 30)

OLD_OPEN = """
import sys
from edge_gateway.errors import EdgeGatewayError
from edge_gateway.journal import Journal, JournalConfig
cfg = JournalConfig(segment_bytes=64 * 1024, max_bytes=1 << 30)
path = sys.stdin.read().strip()
try:
    j = Journal.open_sync(path, cfg)
except EdgeGatewayError as exc:
    print("refused:", exc)
else:
    out = []
    for p in range(4):
        recs = j.read("t", p, 0, max_records=10**6, max_bytes=1 << 30)
        out.append(f"{p}:{len(recs)}:{j.next_offset('t', p)}")
    print("opened", " ".join(out))
    j.close_sync()
"""


def _journal(data: Path) -> tuple[dict[str, bytes], str]:
    """A data directory whose sealed segments are compressed; their entry logs before, and
    what the old gateway should print reading it."""
    j = Journal.open_sync(data / "journal", CFG)
    try:
        for i in range(3000):
            value = b'{"sensor": %d, "temp": %d.%d}' % (i % 13, 20 + i % 7, i % 10)
            j.append_nowait("t", i % 4, encode_batch([value * 3], timestamps=[i]))
        seg_files = sorted((data / "journal").glob("*.wal"))
        sealed = {f.name: f.read_bytes() for f in seg_files[:-1]}
        assert len(sealed) >= 3
        j.rewriter.in_child = False  # quicker here; tests/journal covers the child
        assert trio.run(j.rewriter.rewrite_all) == len(sealed)
        expected = "opened " + " ".join(f"{p}:750:750" for p in range(4))
    finally:
        j.close_sync()
    return sealed, expected


def _files(d: Path) -> dict[str, bytes]:
    """The journal's files (not the lock file, which names its last holder)."""
    return {
        f.name: f.read_bytes()
        for f in sorted(d.iterdir())
        if f.is_file() and f.name != "edgegw.lock"
    }


def test_the_old_gateway_refuses_compressed_segments_and_opens_them_expanded(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    sealed, expected = _journal(data)
    journal = data / "journal"
    assert all(journal.joinpath(n).read_bytes()[:4] == MAGIC for n in sealed)
    old = old_sources(BEFORE_AT_REST, tmp_path / "old")
    assert not (old / "edge_gateway/journal/_compressed.py").exists()

    # before: refused, with a message naming the file and its magic; nothing changed
    before = _files(journal)
    out = run_old(old, OLD_OPEN, str(journal).encode())
    assert out.startswith("refused:"), out
    assert "not a journal segment (magic b'EGWC')" in out, out
    assert min(sealed) in out, out
    assert _files(journal) == before

    done = run_edgegw("journal", "expand", "--data-dir", data)
    assert done.returncode == 0, done.stdout + done.stderr
    text = " ".join(done.stdout.split())
    assert f"{len(sealed)} compressed segments expanded" in text, text
    for name, raw in sealed.items():
        assert (journal / name).read_bytes() == raw, f"{name} is not the entry log it replaced"
    assert not list(journal.glob("*.z-tmp"))

    # the old gateway opens it and reads every record
    out = run_old(old, OLD_OPEN, str(journal).encode())
    assert out.strip() == expected, out

    # again: nothing left to expand
    again = run_edgegw("journal", "expand", "--data-dir", data)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "0 compressed segments expanded" in " ".join(again.stdout.split())


def test_expand_refuses_while_the_journal_is_open(tmp_path: Path) -> None:
    data = tmp_path / "data"
    sealed, _ = _journal(data)
    journal = data / "journal"
    j = Journal.open_sync(journal, CFG)  # what a running gateway holds: the journal's lock
    try:
        before = _files(journal)
        done = run_edgegw("journal", "expand", "--data-dir", data)
        assert done.returncode == 2, done.stdout + done.stderr
        err = " ".join(done.stderr.split())
        assert "error:" in err
        assert str(journal) in err, err
        assert _files(journal) == before
    finally:
        j.close_sync()
    assert all(journal.joinpath(n).read_bytes()[:4] == MAGIC for n in sealed)


def test_expand_needs_a_data_directory(tmp_path: Path) -> None:
    done = run_edgegw("journal", "expand", "--data-dir", tmp_path / "nothing")
    assert done.returncode == 2
    assert "no data directory" in done.stderr
    done = run_edgegw("journal", "expand")
    assert done.returncode == 2
    assert "--config" in done.stderr
