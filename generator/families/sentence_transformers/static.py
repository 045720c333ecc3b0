"""Static embeddings (``StaticEmbedding``, model2vec-style): token ids -> mean of table rows.

sentence-transformers 6.2 runs such a model as: the module's ``tokenizers`` Tokenizer,
``encode_batch(texts, add_special_tokens=False)`` with whatever truncation its
``tokenizer.json`` carries (``max_seq_length`` is infinite; the bundled MiniLM file, for
one, truncates at 128 tokens), then ``nn.EmbeddingBag`` in mean mode over the ids of each
text, then ``Normalize`` when the pipeline has it. A text with no tokens gets a bag of
nothing, an all-zero vector (zero again after Normalize); the serving tokenizer refuses
such a row instead, as it refuses empty text.

The exported graph takes ``input_ids`` and ``attention_mask`` (right-padded rows, the
ragged encoder's usual input) and returns the masked mean of the embedding rows, L2
normalised once per ``Normalize`` module and once more when the manifest asks for it.
The sum runs in EmbeddingBag's order (a CumSum along the tokens): on 16,000 copies of one
token a plain ReduceSum differs from the library by 4e-4, the CumSum by 0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embed_runtime.text.tokenizer import BatchTokenizer, TokenizerParams

# Graph vs SentenceTransformer.encode of the folder (float32): measured 1.2e-7 at most.
MAX_ABS_DIFF = 1e-6
# Rows x width of one ONNX Runtime run: the graph holds [rows, width, dim] gathered floats
# (65,536 tokens x 256 floats x 4 bytes = 64 MiB), where EmbeddingBag streams them.
MAX_TOKENS_PER_RUN = 65536
# Texts the build checks, beside the family's own: truncation, a single token, unicode.
EXTRA_TEXTS = (
    "word " * 300,
    "a",
    "naïve café — résumé, Ελληνικά, русский, עברית, العربية, हिन्दी",
    "\u0301x\u200b",
)


def normalize_steps(model, manifest_normalize: bool) -> int:
    """L2 normalisations after the mean: one per Normalize module, one for the manifest.

    Anything else after the StaticEmbedding (a Dense head) is refused: the declaration
    check refuses it first; this guards a folder whose loaded modules differ.
    """
    rest = [type(m).__name__ for m in list(model)[1:]]
    if any(name != "Normalize" for name in rest):
        raise ValueError(f"a StaticEmbedding followed by {rest} is not supported")
    return len(rest) + int(manifest_normalize)


def encoder_module(model, normalize: int):
    """A torch module: (input_ids, attention_mask) -> masked mean of the table's rows."""
    import torch  # noqa: PLC0415 - generator-only dependency

    weight = model[0].embedding.weight.detach().clone()

    class StaticEncoder(torch.nn.Module):
        """``nn.EmbeddingBag`` (mean) over right-padded rows, then ``normalize`` L2 steps."""

        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(weight, requires_grad=False)

        def forward(self, input_ids, attention_mask):
            rows = torch.nn.functional.embedding(input_ids, self.weight)
            mask = attention_mask.unsqueeze(-1).to(rows.dtype)
            count = mask.sum(dim=1).clamp(min=1.0)
            # EmbeddingBag adds a bag's rows one after another in float32, then divides;
            # ONNX CumSum (ONNX Runtime's CPU kernel) adds in that same order, where a
            # ReduceSum's tree of partial sums drifts from it on long, repetitive texts.
            out = torch.cumsum(rows * mask, dim=1)[:, -1] / count
            for _ in range(normalize):
                out = torch.nn.functional.normalize(out, p=2, dim=1)
            return out

    return StaticEncoder().eval()


def write_tokenizer(model, path: Path) -> int:
    """Save the module's tokenizer as it runs it; returns its truncation length (0: none)."""
    tokenizer = model[0].tokenizer
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    truncation = tokenizer.truncation
    return int(truncation["max_length"]) if truncation else 0


def tokenizer_params(
    input_names: list[str], prompts: dict[str, str], default_prompt: str, max_dimensions: int
) -> TokenizerParams:
    """No special tokens, no truncation of ours (the file's own applies), pad id 0."""
    return TokenizerParams(
        0,
        False,
        tuple(input_names),
        prompts=tuple(sorted(prompts.items())),
        default_prompt_name=default_prompt,
        max_dimensions=max_dimensions,
        add_special_tokens=False,
    )


def _reference_ids(model, text: str, prompt: str | None = None) -> list[int]:
    return model.preprocess([text], prompt=prompt)["input_ids"].tolist()


def check_tokenizer(model, path: Path, params: TokenizerParams, texts: tuple[str, ...]) -> list:
    """The serving tokenizer against the module's own, prompts included; the failures."""
    runtime = BatchTokenizer(str(path), params)
    failures = []
    for name, prompt in (("", ""), *params.prompts):
        for text in texts:
            want = _reference_ids(model, text, prompt or None)
            row = runtime.encode([prompt + text])
            got = row["input_ids"][0][row["attention_mask"][0] == 1].tolist()
            if want != got:
                failures.append(f"prompt {name!r}: tokens differ on {text[:40]!r}")
    return failures


def check_parity(
    model, onnx_path: Path, tokenizer_path: Path, params: TokenizerParams, normalize: bool,
    texts: tuple[str, ...],
) -> float:
    """Max abs difference of the served path vs ``SentenceTransformer.encode``.

    Raises over :data:`MAX_ABS_DIFF`. Texts run all in one padded batch and one by one.
    """
    import onnxruntime as ort  # noqa: PLC0415 - generator-only dependency

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    runtime = BatchTokenizer(str(tokenizer_path), params)
    want = model.encode(list(texts), normalize_embeddings=normalize, convert_to_numpy=True)
    together = session.run(None, runtime.encode(list(texts)))[0]
    alone = np.concatenate([session.run(None, runtime.encode([t]))[0] for t in texts])
    diff = max(float(np.abs(got - want).max()) for got in (together, alone))
    if not diff <= MAX_ABS_DIFF:
        raise RuntimeError(
            f"static embedding graph differs from SentenceTransformer.encode: max|diff| "
            f"{diff:.2e} > {MAX_ABS_DIFF:.0e}"
        )
    return diff


def token_limits(model, truncation: int) -> dict[str, int]:
    """Bounds of direct encoder calls, and the tokens one ONNX Runtime run may hold."""
    limits = {
        "vocab_size": int(model[0].embedding.num_embeddings),
        "max_tokens_per_run": MAX_TOKENS_PER_RUN,
    }
    if truncation:
        limits["max_width"] = truncation
    return limits
