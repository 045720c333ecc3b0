"""Merge the token tensors of many requests, sort rows by length and pad per chunk.

Padding dominates encoder cost on CPU: a batch padded to its longest row does several
times the useful work. The encoder therefore sorts every row it received by true
length, runs chunks padded only to their own longest row, and restores request order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Chunk:
    """Rows (positions in the merged batch) run together, padded to ``width``."""

    rows: np.ndarray
    width: int


def true_lengths(attention_mask: np.ndarray) -> np.ndarray:
    """Number of real tokens of each row (right padding assumed)."""
    return attention_mask.sum(axis=1).astype(np.int64)


def merge_requests(
    requests: Sequence[dict[str, np.ndarray]], pad_id: int = 0
) -> tuple[dict[str, np.ndarray], np.ndarray, list[int]]:
    """Stack per-request [n_i, L_i] tensors into one [sum n_i, max L_i] batch.

    Returns the merged arrays, the true length of every row and the row count of every
    request (to slice results back).
    """
    counts = [len(r["attention_mask"]) for r in requests]
    width = max((r["attention_mask"].shape[1] for r in requests), default=0)
    merged: dict[str, np.ndarray] = {}
    for name in requests[0]:
        fill = pad_id if name == "input_ids" else 0
        out = np.full((sum(counts), width), fill, dtype=np.int64)
        start = 0
        for req, count in zip(requests, counts, strict=True):
            arr = req[name]
            out[start : start + count, : arr.shape[1]] = arr
            start += count
        merged[name] = out
    return merged, true_lengths(merged["attention_mask"]), counts


def plan_chunks(
    lengths: np.ndarray, max_rows: int, max_tokens: int = 0, max_padding: float = 1.0
) -> list[Chunk]:
    """Group rows sorted by length into chunks of at most ``max_rows`` rows.

    With ``max_tokens`` > 0 a chunk also stops growing once ``rows * width`` would pass
    it, which bounds the activations of a chunk of long rows. With ``max_padding`` < 1 it
    stops growing once padding would exceed that share of its ``rows * width`` tokens, so
    a mix of short and long rows runs as a few dense chunks instead of one padded batch
    (0 groups only rows of equal length).
    """
    order = np.argsort(lengths, kind="stable")
    chunks: list[Chunk] = []
    current: list[int] = []
    real = 0
    for row in order:
        length = int(lengths[row])
        width = max(length, 1)
        rows = len(current) + 1
        too_many = len(current) >= max_rows
        too_big = max_tokens > 0 and current and rows * width > max_tokens
        too_padded = current and (rows * width - real - length) > max_padding * rows * width
        if too_many or too_big or too_padded:
            chunks.append(_chunk(current, lengths))
            current, real = [], 0
        current.append(int(row))
        real += length
    if current:
        chunks.append(_chunk(current, lengths))
    return chunks


def _chunk(rows: list[int], lengths: np.ndarray) -> Chunk:
    idx = np.asarray(rows, dtype=np.int64)
    return Chunk(rows=idx, width=max(int(lengths[idx].max()), 1))


def chunk_inputs(merged: dict[str, np.ndarray], chunk: Chunk) -> dict[str, np.ndarray]:
    """The arrays of one chunk, cut to the chunk's own width."""
    return {
        name: np.ascontiguousarray(arr[chunk.rows, : chunk.width]) for name, arr in merged.items()
    }


def run_sorted(
    merged: dict[str, np.ndarray],
    lengths: np.ndarray,
    max_rows: int,
    run,
    max_tokens: int = 0,
    max_padding: float = 1.0,
) -> np.ndarray:
    """Run ``run(inputs) -> [rows, D]`` per chunk and return rows in the original order."""
    result: np.ndarray | None = None
    for chunk in plan_chunks(lengths, max_rows, max_tokens, max_padding):
        out = run(chunk_inputs(merged, chunk))
        if result is None:
            result = np.empty((len(lengths), *out.shape[1:]), dtype=out.dtype)
        result[chunk.rows] = out
    if result is None:
        raise ValueError("no rows to run")
    return result


def split_counts(array: np.ndarray, counts: Sequence[int]) -> Iterator[np.ndarray]:
    """Yield consecutive slices of ``array`` with the given row counts."""
    start = 0
    for count in counts:
        yield array[start : start + count]
        start += count
