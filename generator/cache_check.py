"""The build's gate on the host weight cache: every graph also runs from its cached copy.

Each CPU encoder stub loads its graph from the host weight cache
(``embed_runtime/ops/weight_cache.py``): an optimised copy whose pre-packed weights ONNX
Runtime maps from one file. The families' parity checks run the plain graph, so a copy
that crashes ONNX Runtime (a pre-packed weight off its alignment did, for every SPLADE
graph) or answers differently would first show on the server, as stubs dying at their
first request. So the build runs each graph it is about to write from a fresh cached copy
too, in a child process, and refuses the entry when the copy crashes or differs. An
encoder whose cache is off says so in the build log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from embed_runtime.engines.ort_encoder import EncoderParams
from embed_runtime.ops.weight_cache import check_cached_copy

from .model_dir import ModelDir
from .render import parse_config


def encoder_params(model: ModelDir) -> EncoderParams | None:
    """The ORT runner's parameters of ``model``; None for a dir that is no Python encoder."""
    raw = {k: v.string_value for k, v in parse_config(model.config).parameters.items()}
    if "onnx_file" not in raw:
        return None
    try:
        return EncoderParams.from_parameters(raw)
    except (KeyError, ValueError):
        return None


def check_weight_cache(dirs: Iterable[ModelDir], log: Callable[[str], None] = print) -> None:
    """Run every CPU encoder graph of ``dirs`` from its cached copy; raise when one fails."""
    for model in dirs:
        params = encoder_params(model)
        if params is None or params.execution_provider != "cpu":
            continue
        if not params.weight_cache:
            log(
                f"{model.name}: ONNX Runtime weight cache off (ort_weight_cache = false): "
                "each instance optimises and keeps its own copy of the weights"
            )
            continue
        graph = model.files.get(params.onnx_file)
        if graph is None:
            continue
        problem = check_cached_copy(str(graph), params.graph_optimization, params.vocab_size)
        if problem:
            raise RuntimeError(
                f"{model.name}: the ONNX Runtime weight cache cannot serve this graph: "
                f"{problem}. Set ort_weight_cache = false for the entry to serve it "
                "without the cache (each instance then keeps its own weights)"
            )
