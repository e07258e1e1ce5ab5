"""The region log protocol, sans-IO: head discovery, fencing decisions, manifests.

The shipper (I/O) asks these classes what to do and tells them what happened;
nothing here touches the bucket. The protocol, with every failure case, is
specified in ``docs/protocol.md``. In short:

* A region's log is ``regions/<region>/log/<seq:020d>.egw``, seqs contiguous
  from 1, every entry created with a create-only PUT. That one PUT is the
  commit.
* A starting writer finds the head (the highest seq present), then claims
  epoch = head epoch + 1 by creating head + 1 as a *fence entry*.
* A 412 on a create is resolved by reading the entry that won
  (:func:`classify_conflict`): our own earlier attempt (same epoch and LSN
  range: the response was lost) counts as committed; a higher epoch means we
  are fenced; a lower epoch means a zombie got there first, and we move on to
  the next seq (the zombie will fail there and fence itself).
* Every ``manifest_interval`` the writer creates
  ``regions/<region>/manifest/<last seq:020d>.json`` covering the entries
  since the previous manifest.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from edge_gateway.errors import CorruptData, Fenced


class HeadSearch:
    """Find the highest existing seq of a contiguous log with O(log n) probes.

    ``known`` is a seq known to exist (from the newest manifest) or 0 when
    nothing is known. Probe ``next_probe()``, report with :meth:`record`,
    until ``next_probe()`` returns None; :attr:`head` is then the answer
    (0: empty log). Galloping then bisecting keeps a writer that restarts
    after N new entries at about 2·log2(N) requests, with no LIST.
    """

    def __init__(self, known: int = 0) -> None:
        self._lo = known  # exists (or 0)
        self._hi: int | None = None  # known missing
        self._step = 1

    def next_probe(self) -> int | None:
        if self._hi is None:
            return self._lo + self._step
        if self._hi - self._lo <= 1:
            return None
        return (self._lo + self._hi) // 2

    def record(self, seq: int, exists: bool) -> None:
        if exists:
            if seq <= self._lo:
                return
            self._lo = seq
            if self._hi is None:
                self._step *= 2
        elif self._hi is None or seq < self._hi:
            if seq <= self._lo:
                raise CorruptData(
                    f"log seq {seq} is missing below seq {self._lo}, which exists: "
                    "the log is not contiguous"
                )
            self._hi = seq

    def next_probes(self, width: int) -> list[int]:
        """Up to ``width`` probes to make at once (ascending; empty: done).

        Galloping, the next ``width`` steps (each twice the one before);
        bisecting, ``width`` points splitting the range between what exists
        and what is missing. A log ``k`` entries past ``known`` takes about
        ``2·log2(k)/log2(width + 1)`` rounds instead of ``2·log2(k)`` probes
        one after another -- on a 60 ms link, the difference between ~0.8 s
        and ~0.25 s before a claim or a catch-up can start.
        """
        if self._hi is None:
            return [self._lo + self._step * (1 << k) for k in range(width)]
        gap = self._hi - self._lo
        if gap <= 1:
            return []
        n = min(width, gap - 1)
        return sorted({self._lo + gap * (k + 1) // (n + 1) for k in range(n)})

    def record_batch(self, results: Iterable[tuple[int, bool]]) -> None:
        """Record a round of :meth:`next_probes` (in any order).

        A seq found above one found missing in the same round is ignored:
        the log grew while the round was in flight (or has a hole), and the
        answer stays the contiguous prefix, as probing one at a time would
        have found it.
        """
        for seq, exists in sorted(results):
            if exists and self._hi is not None and seq > self._hi:
                continue
            self.record(seq, exists)

    @property
    def head(self) -> int:
        return self._lo


class Conflict(enum.Enum):
    """What a 412 on creating a log entry means."""

    #: The entry is our own earlier attempt (the response was lost): committed.
    OURS = "ours"
    #: A writer with a higher epoch owns the log: stop.
    FENCED = "fenced"
    #: A lower-epoch writer (a zombie) took the seq first: try the next seq.
    TAKEN_BY_ZOMBIE = "taken-by-zombie"


def classify_conflict(
    *,
    our_epoch: int,
    our_first_lsn: int,
    our_last_lsn: int,
    their_epoch: int,
    their_first_lsn: int,
    their_last_lsn: int,
) -> Conflict:
    """Decide what an existing entry at the seq we tried to create means for us."""
    if their_epoch > our_epoch:
        return Conflict.FENCED
    if their_epoch < our_epoch:
        return Conflict.TAKEN_BY_ZOMBIE
    if (their_first_lsn, their_last_lsn) == (our_first_lsn, our_last_lsn):
        return Conflict.OURS
    # Same epoch, different content: two processes believe they hold the same
    # epoch. Only a configuration error (two gateways sharing one journal
    # identity and racing their claims) gets here; stopping is the only safe move.
    raise Fenced(
        f"another writer uses our epoch {our_epoch} (entry has LSNs "
        f"{their_first_lsn}-{their_last_lsn}, ours {our_first_lsn}-{our_last_lsn})"
    )


@dataclass(slots=True)
class ManifestSchedule:
    """When the next manifest is due: every ``interval_ms`` or ``max_entries`` entries."""

    interval_ms: int = 10_000
    max_entries: int = 100
    first_seq: int = 1  # the first seq the next manifest covers
    last_written_ms: int = 0
    pending: int = 0  # committed entries not covered yet

    def committed(self, count: int = 1) -> None:
        self.pending += count

    def due(self, now_ms: int) -> bool:
        return self.due_in_ms(now_ms) == 0

    def due_in_ms(self, now_ms: int) -> int | None:
        """Milliseconds until a manifest of the pending entries is due (0: now; None: none)."""
        if not self.pending:
            return None
        if self.pending >= self.max_entries:
            return 0
        return max(0, self.interval_ms - (now_ms - self.last_written_ms))

    def written(self, last_seq: int, now_ms: int) -> None:
        self.first_seq = last_seq + 1
        self.pending = 0
        self.last_written_ms = now_ms
