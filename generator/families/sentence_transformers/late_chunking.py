"""The two graphs ``<name>_chunks`` runs for ``late_chunking=true`` (manifest ``late_chunking``).

Late chunking (Günther et al., 2024, arXiv:2409.04701) runs a whole text through the
transformer once and pools each chunk from its tokens' output vectors. The chunks step
needs the pipeline split at its Pooling module:

- ``tokens.onnx``: the Transformer module alone, token tensors in, ``TOKEN_EMBEDDINGS``
  ``[B, L, H]`` out (what ``encode(output_value="token_embeddings")`` returns);
- ``head.onnx``: the modules after Pooling (Dense, Normalize, ...) and the manifest's
  L2 normalisation, a pooled ``[B, H]`` in, ``EMBEDDING`` ``[B, D]`` out.

Both are checked against PyTorch as the main graph is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...onnx_export import GraphSpec, TensorSpec, export_module, validate_graph

TOKENS_FILE = "tokens.onnx"
HEAD_FILE = "head.onnx"
TOKEN_EMBEDDINGS = "TOKEN_EMBEDDINGS"  # noqa: S105 - a tensor name
POOLED = "POOLED"
TOKENS_ATOL = 1e-3


@dataclass(frozen=True)
class LateGraphs:
    """The exported pair, and the token window each transformer pass may take."""

    tokens: Path
    head: Path
    window: int


def _split_at_pooling(model, name: str) -> tuple[object, list]:
    """The Transformer module and the modules after Pooling; refused if not that shape."""
    kinds = [type(module).__name__ for module in model]
    if "Pooling" not in kinds or kinds.index("Pooling") != 1:
        raise ValueError(
            f"{name}: late_chunking needs a Transformer then Pooling pipeline, this one is "
            f"{kinds}"
        )
    return model[0], [model[i] for i in range(2, len(kinds))]


def export_late_graphs(
    model, name: str, input_names: list[str], normalize: bool, work: Path, cases: list[dict]
) -> LateGraphs:
    """Export and check ``tokens.onnx`` and ``head.onnx`` of ``model`` into ``work``."""
    import torch  # noqa: PLC0415

    transformer, after = _split_at_pooling(model, name)
    hidden = int(transformer.get_embedding_dimension())
    dim = int(model.get_embedding_dimension())

    class Tokens(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = transformer

        def forward(self, *tensors):
            features = dict(zip(input_names, tensors, strict=True))
            return self.transformer(features)["token_embeddings"]

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.modules_after = torch.nn.ModuleList(after)

        def forward(self, pooled):
            features = {"sentence_embedding": pooled}
            for module in self.modules_after:
                features = module(features)
            out = features["sentence_embedding"]
            return torch.nn.functional.normalize(out, p=2, dim=1) if normalize else out

    tokens_spec = GraphSpec(
        inputs=tuple(TensorSpec(n, "int64", (-1,)) for n in input_names),
        outputs=(TensorSpec(TOKEN_EMBEDDINGS, "float32", (-1, hidden)),),
    )
    head_spec = GraphSpec(
        inputs=(TensorSpec(POOLED, "float32", (hidden,)),),
        outputs=(TensorSpec("EMBEDDING", "float32", (dim,)),),
    )
    tokens_path, head_path = work / TOKENS_FILE, work / HEAD_FILE
    tokens_module, head_module = Tokens().eval(), Head().eval()
    export_module(tokens_module, tokens_spec, cases[0], tokens_path)
    # Raw hidden states (values up to ~10) at padded positions too: a looser absolute gate;
    # the chunk vectors themselves are checked in tests within 1e-5 of the library.
    validate_graph(tokens_path, tokens_spec, tokens_module, cases, atol=TOKENS_ATOL)
    rng = np.random.default_rng(0)
    pooled = [{POOLED: rng.standard_normal((n, hidden)).astype(np.float32)} for n in (1, 5)]
    export_module(head_module, head_spec, pooled[1], head_path)
    validate_graph(head_path, head_spec, head_module, pooled)
    return LateGraphs(tokens_path, head_path, int(model.max_seq_length))
