"""The model folder for infinity's ONNX (optimum) engine: the local one plus a ``model.onnx``.

The graph returns ``last_hidden_state``, exported with the project's own exporter
(infinity's pinned ``optimum-cli`` cannot export with this torch).
"""

from __future__ import annotations

import shutil
from pathlib import Path


def infinity_onnx_folder(model_path: str, out: Path) -> Path:
    """``out``: the model folder with ``model.onnx`` (``last_hidden_state``); reused if there."""
    if (out / "model.onnx").is_file():
        return out
    import torch
    from transformers import AutoModel

    from generator.onnx_export import GraphSpec, TensorSpec, export_module

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(model_path, tmp, ignore=shutil.ignore_patterns("*.onnx"))
    model = AutoModel.from_pretrained(model_path).eval()
    names = ("input_ids", "attention_mask", "token_type_ids")

    class Transformer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    spec = GraphSpec(
        inputs=tuple(TensorSpec(n, "int64", (-1,)) for n in names),
        outputs=(TensorSpec("last_hidden_state", "float32", (-1, model.config.hidden_size)),),
    )
    sample = {n: torch.ones((2, 8), dtype=torch.int64) for n in names}
    export_module(Transformer(), spec, sample, tmp / "model.onnx")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
