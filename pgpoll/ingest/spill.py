"""A transaction buffer that spills to local disk, so one huge transaction fits in bounded memory.

Changes of an open transaction must wait for its COMMIT (only then is its
``commit_lsn`` known). :class:`SpillBuffer` keeps at most ``limit`` of them
in memory; older ones are pickled in chunks to a temporary file on the
executor's local disk and read back, in order, when the transaction commits.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from typing import IO, Any, Iterator, MutableSequence, Optional


class SpillBuffer(MutableSequence[Any]):
    """An append-and-iterate buffer with a bounded in-memory part."""

    def __init__(self, limit: int = 20_000, directory: Optional[str] = None) -> None:
        self._limit = limit
        self._directory = directory
        self._memory: list[Any] = []
        self._file: Optional[IO[bytes]] = None
        self._spilled = 0

    def append(self, value: Any) -> None:
        """Add one change; spills the in-memory part when it reaches the limit."""
        self._memory.append(value)
        if len(self._memory) >= self._limit:
            self._spill()

    def _spill(self) -> None:
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="pgpoll-txn-", dir=self._directory)
        pickle.dump(self._memory, self._file, protocol=pickle.HIGHEST_PROTOCOL)
        self._spilled += len(self._memory)
        self._memory = []

    @property
    def spilled(self) -> int:
        """How many changes went to disk."""
        return self._spilled

    def __iter__(self) -> Iterator[Any]:
        if self._file is not None:
            self._file.flush()
            self._file.seek(0)
            while True:
                try:
                    chunk = pickle.load(self._file)
                except EOFError:
                    break
                yield from chunk
            self._file.seek(0, os.SEEK_END)
        yield from self._memory

    def __len__(self) -> int:
        return self._spilled + len(self._memory)

    def close(self) -> None:
        """Delete the spill file."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __del__(self) -> None:
        self.close()

    # MutableSequence's other methods make no sense for a spilled buffer.
    def __getitem__(self, index: Any) -> Any:
        raise TypeError("SpillBuffer supports append and iteration only")

    def __setitem__(self, index: Any, value: Any) -> None:
        raise TypeError("SpillBuffer supports append and iteration only")

    def __delitem__(self, index: Any) -> None:
        raise TypeError("SpillBuffer supports append and iteration only")

    def insert(self, index: int, value: Any) -> None:
        """Not supported (append only)."""
        raise TypeError("SpillBuffer supports append and iteration only")
