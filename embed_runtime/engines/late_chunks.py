"""Late chunking: chunk vectors pooled from one transformer pass over the whole text.

The method of Günther et al. (2024, arXiv:2409.04701), as its published code runs it
(github.com/jina-ai/late-chunking, ``chunked_pooling/mteb_chunked_eval.py``:
``_embed_with_overlap``, ``_extend_special_tokens``; ``chunked_pooling/__init__.py``:
``chunked_pooling``):

- the text is tokenized whole, its prompt and special tokens added as for any text;
- a sequence longer than the model's window runs in windows of ``window`` tokens, each
  starting ``window - overlap`` after the last; of every window but the first, the first
  ``overlap`` output vectors are dropped, and the rest are joined in order;
- each chunk is the mean of its tokens' output vectors, the first chunk taking the
  leading special and prompt tokens, the last the trailing special tokens;
- the pooled vectors then go through the model's modules after its Pooling (Dense,
  Normalize) and its L2 normalisation (``head.onnx``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidInputError
from ..text.chunking import Chunk, plan, span

TOKENS_FILE, HEAD_FILE = "tokens.onnx", "head.onnx"
TOKEN_EMBEDDINGS, POOLED = "TOKEN_EMBEDDINGS", "POOLED"
# The published runs use windows of 512 tokens overlapping by 256: half of a window.
OVERLAP_SHARE = 0.5


@dataclass(frozen=True)
class Sequenced:
    """A text tokenized whole: ids, type ids and where each content token sits."""

    ids: list[int]
    type_ids: list[int]
    positions: list[int]  # sequence position of each content token
    offsets: list[tuple[int, int]]  # its span in the text (prompt removed)


def window_ranges(length: int, window: int, overlap: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` windows a sequence of ``length`` tokens runs in."""
    if length <= window:
        return [(0, length)]
    step = window - overlap
    return [(start, min(start + window, length)) for start in range(0, length, step)]


def pooled_ranges(chunks: Sequence[tuple[int, int]], seq: Sequenced) -> list[tuple[int, int]]:
    """Sequence ranges pooled for the content-token ranges ``chunks`` of one text."""
    out = []
    for n, (i, k) in enumerate(chunks):
        start = 0 if n == 0 else seq.positions[i]
        end = len(seq.ids) if n == len(chunks) - 1 else seq.positions[k - 1] + 1
        out.append((start, end))
    return out


class LateChunker:
    """Runs ``tokens.onnx`` and ``head.onnx`` of a ``<name>_chunks`` folder, opened once."""

    def __init__(self, model_dir: str, tokenizer, input_names: Sequence[str], window: int,
                 lowercase: bool = False, threads: int = 0):
        import onnxruntime as ort  # noqa: PLC0415 - serve-time dependency

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        providers = ["CPUExecutionProvider"]
        self.tokens = ort.InferenceSession(
            os.path.join(model_dir, TOKENS_FILE), options, providers=providers
        )
        self.head = ort.InferenceSession(
            os.path.join(model_dir, HEAD_FILE), options, providers=providers
        )
        self.tokenizer, self.input_names = tokenizer, tuple(input_names)
        self.window, self.overlap = window, int(window * OVERLAP_SHARE)
        self.lowercase = lowercase

    def sequence(self, text: str, prompt: str) -> Sequenced:
        """``prompt + text`` tokenized with special tokens; content tokens located."""
        whole = prompt + text
        encoding = self.tokenizer.encode(whole.lower() if self.lowercase else whole)
        positions, offsets = [], []
        for j, ((start, end), special) in enumerate(
            zip(encoding.offsets, encoding.special_tokens_mask, strict=True)
        ):
            if not special and start >= len(prompt) and end > start:
                positions.append(j)
                offsets.append((start - len(prompt), end - len(prompt)))
        return Sequenced(list(encoding.ids), list(encoding.type_ids), positions, offsets)

    def token_vectors(self, seq: Sequenced) -> np.ndarray:
        """The transformer's output vector of every token of ``seq`` ([T, H])."""
        parts = []
        for start, end in window_ranges(len(seq.ids), self.window, self.overlap):
            ids = np.asarray([seq.ids[start:end]], dtype=np.int64)
            feeds = {
                "input_ids": ids,
                "attention_mask": np.ones_like(ids),
                "token_type_ids": np.asarray([seq.type_ids[start:end]], dtype=np.int64),
            }
            (out,) = self.tokens.run(
                [TOKEN_EMBEDDINGS], {n: feeds[n] for n in self.input_names}
            )
            parts.append(out[0] if start == 0 else out[0][self.overlap :])
        return np.concatenate(parts, axis=0)

    def embed(self, seq: Sequenced, ranges: Sequence[tuple[int, int]]) -> np.ndarray:
        """The vectors ([M, D]) of the chunks of ``seq`` at content-token ``ranges``."""
        vectors = self.token_vectors(seq)
        pooled = np.stack(
            [vectors[a:b].mean(axis=0) for a, b in pooled_ranges(ranges, seq)]
        ).astype(np.float32)
        (out,) = self.head.run(["EMBEDDING"], {POOLED: pooled})
        return out

    def chunks(
        self, texts: Sequence[str], size: int, overlap: int, prompt: str, join: bool
    ) -> tuple[list[Chunk], np.ndarray]:
        """The chunks of ``texts`` and their late vectors.

        ``join``: the rows are consecutive pieces of one document (joined with a space),
        each row one chunk; else each row is cut into chunks of ``size`` tokens.
        """
        if join:
            return self._pieces(texts, prompt)
        chunks, vectors = [], []
        for row, text in enumerate(texts):
            seq = self.sequence(text, prompt)
            if not seq.positions:
                raise InvalidInputError(f"TEXT row {row} has no tokens")
            ranges = plan(text, seq.offsets, size, overlap)
            chunks += [Chunk(row, *span(text, seq.offsets, i, k), k - i) for i, k in ranges]
            vectors.append(self.embed(seq, ranges))
        return chunks, np.concatenate(vectors, axis=0)

    def _pieces(self, texts: Sequence[str], prompt: str) -> tuple[list[Chunk], np.ndarray]:
        document = " ".join(texts)
        seq = self.sequence(document, prompt)
        bounds, at = [], 0
        for text in texts:
            bounds.append((at, at + len(text)))
            at += len(text) + 1
        ranges, chunks = [], []
        for row, (lo, hi) in enumerate(bounds):
            inside = [n for n, (s, e) in enumerate(seq.offsets) if s >= lo and e <= hi]
            if not inside:
                raise InvalidInputError(f"TEXT row {row} has no tokens of its own")
            ranges.append((inside[0], inside[-1] + 1))
            chunks.append(Chunk(row, 0, len(texts[row]), len(inside)))
        return chunks, self.embed(seq, ranges)
