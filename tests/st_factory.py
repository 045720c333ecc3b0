"""Tiny random-initialised sentence-transformers models, one per pooling mode and head.

Built offline: a seeded 2-layer BERT (hidden 32) whose tokenizer files are those of the
bundled all-MiniLM-L6-v2, assembled from sentence-transformers' own Transformer,
Pooling, Dense and Normalize modules and saved with ``SentenceTransformer.save``, so the
saved folder has the ``modules.json`` / ``1_Pooling/config.json`` a real model has.
Static models (:data:`STATIC_VARIANTS`) are a seeded ``StaticEmbedding`` over the same
tokenizer, with or without its 128-token truncation and a Normalize module.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from pathlib import Path

import numpy as np

from client.load.corpus import LONG_TEXTS, SENTENCES
from generator.fixtures.common import (
    TINY_SIZES,
    minilm_dir,
    minilm_tokenizer,
    pretrained_folder,
    seeded_model,
    tiny_config,
)

HIDDEN = TINY_SIZES["hidden_size"]
DENSE_OUT = 16
MAX_SEQ_LENGTH = 64


@dataclass(frozen=True)
class _Variant:
    """What every tiny model has: a name, where it is normalised, and its seed.

    ``normalize_module`` puts sentence-transformers' Normalize module in the pipeline;
    ``manifest_normalize`` is the manifest entry's ``normalize`` (L2 in the graph).
    """

    name: str
    _: KW_ONLY
    normalize_module: bool = False
    manifest_normalize: bool = False
    seed: int = 0

    @property
    def normalized(self) -> bool:
        """Whether the served embedding is L2-normalised."""
        return self.normalize_module or self.manifest_normalize


@dataclass(frozen=True)
class TinyVariant(_Variant):
    """One tiny BERT model: its pooling mode, optional Dense head and normalisation."""

    pooling: str
    dense: bool = False

    @property
    def dim(self) -> int:
        """Width of the sentence embedding."""
        return DENSE_OUT if self.dense else HIDDEN


# Pooling variants carry no normalisation, so the raw pooled vectors are compared (a wrong
# denominator or weight would vanish under L2 normalisation). Mean is the control and
# keeps the Normalize module (as all-MiniLM-L6-v2 does); the Dense model relies on the
# manifest's ``normalize`` instead.
VARIANTS = (
    TinyVariant("tiny-mean", "mean", normalize_module=True, seed=1),
    TinyVariant("tiny-cls", "cls", seed=2),
    TinyVariant("tiny-max", "max", seed=3),
    TinyVariant("tiny-lasttoken", "lasttoken", seed=4),
    TinyVariant("tiny-weightedmean", "weightedmean", seed=5),
    TinyVariant("tiny-dense", "mean", dense=True, manifest_normalize=True, seed=6),
)


def tokenizer_dir() -> Path:
    """The folder of the bundled all-MiniLM-L6-v2 (its tokenizer files are reused)."""
    return minilm_dir()


def build_tiny_model(variant: TinyVariant, folder: Path) -> Path:
    """Create ``variant`` with seeded random weights and save it to ``folder``."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        Normalize,
        Pooling,
        Transformer,
    )
    from transformers import BertConfig, BertModel

    tokenizer = minilm_tokenizer()
    config = tiny_config(
        BertConfig, tokenizer.vocab_size, num_attention_heads=4, max_position_embeddings=128
    )
    bert = seeded_model(BertModel, config, variant.seed)
    with pretrained_folder(bert, tokenizer, folder) as raw:
        modules = [
            Transformer(raw, max_seq_length=MAX_SEQ_LENGTH),
            Pooling(HIDDEN, pooling_mode=variant.pooling),
        ]
        if variant.dense:
            modules.append(Dense(HIDDEN, DENSE_OUT, activation_function=torch.nn.Tanh()))
        if variant.normalize_module:
            modules.append(Normalize())
        SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return folder


def manifest_entry(variant: TinyVariant, folder: Path, **fields: object) -> dict:
    """The manifest entry (as a dict) serving the model saved in ``folder``."""
    return {
        "name": variant.name,
        "family": "sentence-transformers",
        "source": str(folder),
        "normalize": variant.manifest_normalize,
        **fields,
    }


def load_reference(folder: Path):
    """The saved model loaded back by sentence-transformers, the way users load it."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu")


def reference_embeddings(model, variant: TinyVariant, texts: list[str]) -> np.ndarray:
    """What users get from ``model.encode`` (normalised as the manifest entry asks)."""
    return model.encode(
        texts, batch_size=16, normalize_embeddings=variant.manifest_normalize, convert_to_numpy=True
    )


def parity_texts() -> list[str]:
    """Short, medium and over-long texts (truncated at 64 tokens) in a mixed order."""
    texts = [*SENTENCES[::2], *LONG_TEXTS, "x", "OK", "a b", "Why?"]
    order = np.random.default_rng(0).permutation(len(texts))
    return [texts[i] for i in order]


def parity(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """Minimum row cosine and maximum absolute difference of two embedding matrices."""
    a, b = got.astype(np.float64), want.astype(np.float64)
    cos = np.sum(a * b, axis=1) / np.maximum(
        np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12
    )
    return float(cos.min()), float(np.abs(a - b).max())


STATIC_DIM = 16


@dataclass(frozen=True)
class StaticVariant(_Variant):
    """A tiny StaticEmbedding model (model2vec-style: the mean of token rows).

    ``truncate`` keeps the MiniLM ``tokenizer.json``'s own 128-token truncation, which
    StaticEmbedding keeps too; without it a text's every token counts.
    """

    truncate: bool = True

    @property
    def dim(self) -> int:
        """Width of the sentence embedding."""
        return STATIC_DIM


STATIC_VARIANTS = (
    StaticVariant("static-normalize", normalize_module=True, seed=11),
    StaticVariant("static-raw", truncate=False, seed=12),
    StaticVariant("static-manifest-normalize", manifest_normalize=True, truncate=False, seed=13),
)


def build_static_model(variant: StaticVariant, folder: Path) -> Path:
    """Create ``variant`` with seeded random rows and save it to ``folder``."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, StaticEmbedding
    from tokenizers import Tokenizer

    torch.manual_seed(variant.seed)
    tokenizer = Tokenizer.from_file(str(tokenizer_dir() / "tokenizer.json"))
    if not variant.truncate:
        tokenizer.no_truncation()
    modules = [StaticEmbedding(tokenizer, embedding_dim=STATIC_DIM)]
    if variant.normalize_module:
        modules.append(Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return folder


def static_texts() -> list[str]:
    """Varied texts for static models: unicode, one token, very long (3,000 tokens)."""
    from client.load.corpus import varied_sentences

    texts = [
        *varied_sentences(40),
        *LONG_TEXTS,
        "a",
        "x",
        "Zürich, naïve café, Ελληνικά, русский, עברית, العربية, हिन्दी, 東京, 🙂🚀",
        "word " * 3000,
        "\u0301x\u200b",
    ]
    order = np.random.default_rng(1).permutation(len(texts))
    return [texts[i] for i in order]
