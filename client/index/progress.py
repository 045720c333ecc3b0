"""Progress of a run: a bar on a terminal, plain periodic lines otherwise, or nothing."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def _eta(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Counts rows done (embedded or failed) and shows them.

    ``mode``: ``bar`` (tqdm: rows/s, ETA, errors), ``lines`` (one line every
    ``every_s``), ``quiet`` (nothing). ``total``: rows of the whole input; ``skipped``
    rows (finished shards) count as done from the start and not in the rate.
    """

    def __init__(
        self,
        total: int | None,
        mode: str = "lines",
        stream: TextIO | None = None,
        every_s: float = 10.0,
        clock: Any = time.monotonic,
    ):
        self.total = total
        self.mode = mode
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self.clock = clock
        self.start = clock()
        self.done = 0
        self.new = 0
        self.errors = 0
        self._last = self.start
        self._bar = None
        if mode == "bar":
            from tqdm import tqdm  # noqa: PLC0415 - the index extra; only on a terminal

            self._bar = tqdm(total=total, unit="row", file=self.stream, dynamic_ncols=True)

    @staticmethod
    def auto_mode(quiet: bool, stream: TextIO | None = None) -> str:
        """``quiet``, else ``bar`` on a terminal, else ``lines``."""
        if quiet:
            return "quiet"
        return "bar" if (stream or sys.stderr).isatty() else "lines"

    def skip(self, rows: int) -> None:
        """Rows of shards already done."""
        self.done += rows
        if self._bar is not None:
            self._bar.update(rows)

    def advance(self, rows: int, errors: int) -> None:
        """A shard written: ``rows`` rows answered, ``errors`` of them failed."""
        self.done += rows
        self.new += rows
        self.errors += errors
        if self._bar is not None:
            self._bar.update(rows)
            self._bar.set_postfix(errors=self.errors, refresh=False)
        elif self.mode == "lines" and self.clock() - self._last >= self.every_s:
            self._last = self.clock()
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def rate(self) -> float:
        """Rows per second of this run (skipped rows not counted)."""
        elapsed = self.clock() - self.start
        return self.new / elapsed if elapsed > 0 else 0.0

    def line(self) -> str:
        """``index: 1200/5000 rows (24.0%), 310.2 rows/s, ETA 0:00:12, 3 errors``."""
        rate = self.rate()
        if self.total:
            share = f"/{self.total} rows ({100 * self.done / self.total:.1f}%)"
            left = max(0, self.total - self.done)
            eta = f", ETA {_eta(left / rate)}" if rate > 0 else ""
        else:
            share, eta = " rows", ""
        return f"index: {self.done}{share}, {rate:.1f} rows/s{eta}, {self.errors} errors"

    def close(self) -> None:
        """End the bar (nothing to do for lines)."""
        if self._bar is not None:
            self._bar.close()
