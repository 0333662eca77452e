"""Which changes a table's snapshot already holds: by transaction visibility in the key's chunk, never by LSN.

A change is applied on top of a snapshot's rows iff its transaction (the
full 64-bit ``_xid`` of the typed change row) is *not* visible in the
snapshot of the chunk its key falls in. Ordering by LSN would be wrong: a
commit record can be in the WAL before a snapshot is taken while that
transaction is still invisible to it (a commit waiting for a synchronous
standby). Each fact of a change is placed on its own: an UPDATE that moves a
row from chunk 1 to chunk 2 removes the old key unless chunk 1 saw it and
adds the new key unless chunk 2 saw it.

Chunks of a ``chunked`` table are key ranges ``lo < key <= hi`` (row
comparison; Spark's struct ordering reproduces PostgreSQL's for the key
types the snapshot job chunks by: integers, uuid text, bytea, text under the
C collation). A ``shared`` table has one snapshot for all its rows.

A TRUNCATE empties a chunk only when it is invisible to that chunk; the
latest such TRUNCATE per chunk is the chunk's *cutoff*: the chunk's rows and
every earlier fact of its keys are dropped.

The Spark expressions are built lazily (pyspark imported inside methods);
the rest is pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pgpoll.xids import Snapshot

Position = tuple[int, int]  # (commit_lsn, seq)


@dataclass(frozen=True)
class ChunkRange:
    """A chunk's key range (``None`` = open end) and the snapshot it was read under."""

    lo: tuple[Any, ...] | None
    hi: tuple[Any, ...] | None
    snapshot: Snapshot


@dataclass(frozen=True)
class SnapshotFilter:
    """The visibility rule of one table's snapshot.

    ``key`` names the state columns the chunks are ranges of, ``key_ddls``
    their Spark types; empty for a shared snapshot (one chunk, no bounds).
    """

    chunks: tuple[ChunkRange, ...]
    key: tuple[str, ...] = ()
    key_ddls: tuple[str, ...] = ()

    @property
    def shared(self) -> bool:
        """One snapshot for every row (no key placement needed)."""
        return not self.key or len(self.chunks) <= 1

    def cutoffs(self, truncates: Sequence[tuple[int, int, int | None]]) -> list[Position | None]:
        """Per chunk, the position of the latest TRUNCATE ``(lsn, seq, xid)`` invisible to it (None: none)."""
        out: list[Position | None] = []
        for chunk in self.chunks:
            invisible = [(lsn, seq) for lsn, seq, xid in truncates if xid is None or not chunk.snapshot.visible(xid)]
            out.append(max(invisible) if invisible else None)
        return out

    def all_visible(self, xid_max: int) -> bool:
        """Whether every transaction up to ``xid_max`` is visible to every chunk (a batch that can be skipped)."""
        return bool(self.chunks) and all(xid_max < c.snapshot.xmin for c in self.chunks)

    # ---- Spark expressions ----------------------------------------------------------------------

    def contiguous(self) -> bool:
        """Whether the ranges tile the key space in order (each ``lo`` the previous ``hi``, both ends open)."""
        c = self.chunks
        return bool(c) and c[0].lo is None and c[-1].hi is None and all(c[i].lo == c[i - 1].hi for i in range(1, len(c)))

    def chunk_of(self, field: Callable[[str], Any]) -> Any:
        """The chunk index of a key (``field(name)`` gives the key column), -1 when outside every range.

        Contiguous ranges (what the snapshot job plans) are searched by
        bisection on ``hi``: log2(chunks) comparisons per fact.
        """
        from pyspark.sql import functions as F

        if self.shared:
            return F.lit(0)
        key = F.struct(*[field(k).alias(f"k{i}") for i, k in enumerate(self.key)])

        def bound(values: tuple[Any, ...]) -> Any:
            pairs = zip(values, self.key_ddls, strict=True)
            return F.struct(*[F.lit(bytearray(v) if isinstance(v, bytes) else v).cast(t).alias(f"k{i}")
                              for i, (v, t) in enumerate(pairs)])

        if self.contiguous():
            def search(first: int, last: int) -> Any:
                if first == last:
                    return F.lit(first)
                mid = (first + last) // 2
                hi = self.chunks[mid].hi
                assert hi is not None
                return F.when(key <= bound(hi), search(first, mid)).otherwise(search(mid + 1, last))

            return search(0, len(self.chunks) - 1)
        out = F.lit(-1)
        for n in reversed(range(len(self.chunks))):
            c = self.chunks[n]
            cond = F.lit(True)
            if c.lo is not None:
                cond = cond & (key > bound(c.lo))
            if c.hi is not None:
                cond = cond & (key <= bound(c.hi))
            out = F.when(cond, F.lit(n)).otherwise(out)
        return out

    def visible(self, chunk: Any, xid: Any) -> Any:
        """Whether transaction ``xid`` is visible in chunk ``chunk``'s snapshot (null outside every chunk)."""
        from pyspark.sql import functions as F

        if not self.chunks:
            return F.lit(False)
        return visible_in([c.snapshot for c in self.chunks], F.lit(0) if self.shared else chunk, xid)

    def keep(self, chunk: Any, xid: Any, position: Any, cutoffs: Sequence[Position | None]) -> Any:
        """Whether a fact survives: base facts (``xid`` null) and invisible changes, after their chunk's cutoff."""
        from pyspark.sql import functions as F

        kept = xid.isNull() | ~F.coalesce(self.visible(chunk, xid), F.lit(False))
        if any(c is not None for c in cutoffs):
            kind = "struct<l:bigint,s:int>"
            cuts = F.array(*[
                F.struct(F.lit(c[0]).cast("bigint").alias("l"), F.lit(c[1]).cast("int").alias("s")) if c is not None
                else F.lit(None).cast(kind)
                for c in cutoffs
            ])
            cut = F.when(chunk.between(0, len(cutoffs) - 1), F.element_at(cuts, chunk + 1))
            kept = kept & (cut.isNull() | (position > cut))
        return kept


def visible_in(snapshots: Sequence[Snapshot], index: Any, xid: Any) -> Any:
    """Whether transaction ``xid`` is visible in ``snapshots[index]`` (null for an index outside them): the
    snapshots as an array of ``struct<n: xmin, x: xmax, p: xip>``, one lookup per row."""
    from pyspark.sql import functions as F

    shots = F.array(*[
        F.struct(F.lit(s.xmin).cast("bigint").alias("n"), F.lit(s.xmax).cast("bigint").alias("x"),
                 F.array(*[F.lit(x) for x in s.xip]).cast("array<bigint>").alias("p"))
        for s in snapshots
    ])
    s = F.when(index.between(0, len(snapshots) - 1), F.element_at(shots, index + 1))
    return (xid < s["n"]) | ((xid < s["x"]) & ~F.array_contains(s["p"], xid))


def position_struct() -> Any:
    """``(_commit_lsn, _seq)`` as a struct comparable with :meth:`SnapshotFilter.keep`'s cutoffs."""
    from pyspark.sql import functions as F

    return F.struct(F.col("_commit_lsn").cast("bigint").alias("l"), F.col("_seq").cast("int").alias("s"))
