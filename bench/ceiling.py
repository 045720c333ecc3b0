"""The ceiling: the exported ONNX graphs run directly by ONNX Runtime, in-process.

Text: the served ``model.onnx`` and tokenizer over the loads' sentences (sorted batches of
32, batch 1, optionally a random mix); images: the image tower on random pixels. The
method: ``bench/templates/method.md``.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

BATCH = 32


def config_parameters(model_dir: Path) -> dict[str, str]:
    """The string ``parameters`` of ``model_dir/config.pbtxt``."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse(
        (model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    return {key: value.string_value for key, value in config.parameters.items()}


def make_session(
    onnx_path: Path, device: str = "cpu", graph_optimization: str = "all", threads: int = 0
):
    """An ONNX Runtime session (``threads`` 0: one per core) as the served encoders make it.

    On the CPU it loads the served encoders' weight-cached copy (``ort_weight_cache``).
    """
    import onnxruntime as ort

    from embed_runtime.ops.weight_cache import cached_model, graph_level

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    providers = ["CPUExecutionProvider"]
    if device == "gpu" and "CUDAExecutionProvider" in ort.get_available_providers():
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    path = str(onnx_path)
    if providers[0] == "CPUExecutionProvider":
        path, graph_optimization = cached_model(path, graph_optimization), "disable"
    options.graph_optimization_level = graph_level(ort, graph_optimization)
    return ort.InferenceSession(path, sess_options=options, providers=providers)


def per_core_sessions(onnx_path: Path, device: str = "cpu") -> list:
    """One single-threaded CPU session per core; none on a GPU or a single core."""
    cores = os.cpu_count() or 1
    if device != "cpu" or cores < 2:
        return []
    return [make_session(onnx_path, threads=1) for _ in range(cores)]


@dataclass
class TextCeiling:
    """Raw ORT throughput and latency over the benchmark sentences."""

    provider: str
    sentences: int
    mean_tokens: float
    batch32_items_per_s: float
    batch1_items_per_s: float
    batch1_p50_ms: float
    batch1_p95_ms: float
    tokenize_us_per_sentence: float
    batch32_real_token_share: float
    mixed_batch: int = 0
    mixed_items_per_s: float = float("nan")
    mixed_real_token_share: float = float("nan")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for the results file."""
        return asdict(self)


def served_tokenizer(repo: Path, model: str):
    """The ``BatchTokenizer`` of ``<model>_tokenize`` (``_encode`` with ``fused_tokenize``)."""
    from embed_runtime.text.tokenizer import BatchTokenizer, TokenizerParams

    tok_dir = repo / f"{model}_tokenize"
    if not tok_dir.is_dir():
        tok_dir = repo / f"{model}_encode"
    params = TokenizerParams.from_parameters(config_parameters(tok_dir))
    return BatchTokenizer(str(tok_dir / "1" / "tokenizer.json"), params)


def chunk_settings(repo: Path, model: str) -> tuple[int, float]:
    """``(max_rows_per_run, max_padding_share)`` of the served ``<model>_encode``."""
    params = config_parameters(repo / f"{model}_encode")
    return int(params["max_rows_per_run"]), float(params["max_padding_share"])


def tokenize_sentences(
    repo: Path, model: str, sentences: list[str]
) -> tuple[dict, np.ndarray, float]:
    """Token arrays, true lengths and µs per sentence, with ``<model>_tokenize``'s tokenizer."""
    tokenizer = served_tokenizer(repo, model)
    start = time.perf_counter()
    for i in range(0, len(sentences), BATCH):
        tokenizer.encode(sentences[i : i + BATCH])
    per_sentence_us = (time.perf_counter() - start) / len(sentences) * 1e6
    arrays = tokenizer.encode(sentences)
    lengths = arrays["attention_mask"].sum(axis=1)
    return arrays, lengths, per_sentence_us


def _timed(session, feeds: list[dict[str, np.ndarray]]) -> float:
    start = time.perf_counter()
    for feed in feeds:
        session.run(None, feed)
    return time.perf_counter() - start


def _each_timed(session, feeds: list[dict[str, np.ndarray]]) -> list[float]:
    times = []
    for feed in feeds:
        start = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - start)
    return times


def text_ceiling(
    repo: Path,
    model: str,
    sentences: list[str],
    device: str = "cpu",
    mixed_batch: int = 0,
    session=None,
) -> TextCeiling:
    """Measure ``<model>_encode/1/model.onnx`` (or ``session``) on ``sentences`` once."""
    session = session or make_session(repo / f"{model}_encode" / "1" / "model.onnx", device)
    names = {i.name for i in session.get_inputs()}
    arrays, lengths, tokenize_us = tokenize_sentences(repo, model, sentences)
    arrays = {k: v for k, v in arrays.items() if k in names}

    def cut(rows: np.ndarray) -> dict[str, np.ndarray]:
        width = int(lengths[rows].max())
        return {k: np.ascontiguousarray(v[rows, :width]) for k, v in arrays.items()}

    order = np.argsort(lengths, kind="stable")
    chunks = [order[i : i + BATCH] for i in range(0, len(order), BATCH)]
    batches = [cut(rows) for rows in chunks]
    padded = sum(len(rows) * int(lengths[rows].max()) for rows in chunks)
    singles = [cut(np.array([i])) for i in range(len(sentences))]
    for feed in batches[:2] + singles[:8]:
        session.run(None, feed)
    batch_s = _timed(session, batches)
    mixed_s, mixed_share = float("nan"), float("nan")
    if mixed_batch:
        mix = np.random.default_rng(0).permutation(len(sentences))
        groups = [np.sort(mix[i : i + mixed_batch]) for i in range(0, len(mix), mixed_batch)]
        mixed_s = _timed(session, [cut(rows) for rows in groups])
        mixed_padded = sum(len(rows) * int(lengths[rows].max()) for rows in groups)
        mixed_share = float(lengths.sum()) / mixed_padded
    times = _each_timed(session, singles)
    ms = np.asarray(times) * 1000.0
    return TextCeiling(
        provider=session.get_providers()[0],
        sentences=len(sentences),
        mean_tokens=float(lengths.mean()),
        batch32_items_per_s=len(sentences) / batch_s,
        batch1_items_per_s=len(sentences) / float(np.sum(times)),
        batch1_p50_ms=float(np.median(ms)),
        batch1_p95_ms=float(np.percentile(ms, 95)),
        tokenize_us_per_sentence=tokenize_us,
        batch32_real_token_share=float(lengths.sum()) / padded,
        mixed_batch=mixed_batch,
        mixed_items_per_s=len(sentences) / mixed_s if mixed_batch else float("nan"),
        mixed_real_token_share=mixed_share,
    )


@dataclass
class ImageCeiling:
    """Raw ORT throughput of the image tower on ready-made pixels."""

    provider: str
    batch32_items_per_s: float
    batch1_items_per_s: float
    batch1_p50_ms: float
    parallel_items_per_s: float = 0.0

    @property
    def best_items_per_s(self) -> float:
        """The best of the ways measured."""
        return max(self.batch32_items_per_s, self.batch1_items_per_s, self.parallel_items_per_s)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for the results file."""
        return asdict(self)


def image_ceiling(
    repo: Path, model: str, device: str = "cpu", images: int = 64, singles: int = 16
) -> ImageCeiling:
    """Measure ``<model>_encode_image/1/model.onnx`` at batch 32, batch 1 and in parallel.

    ``parallel``: the images split over :func:`per_core_sessions`, run at once from threads.
    """
    path = repo / f"{model}_encode_image" / "1" / "model.onnx"
    parallel = _parallel_images(per_core_sessions(path, device), images)
    session = make_session(path, device)
    graph_input = session.get_inputs()[0]
    size = [int(d) for d in graph_input.shape[1:]]
    rng = np.random.default_rng(0)
    pixels = rng.standard_normal((images, *size)).astype(np.float32)
    session.run(None, {graph_input.name: pixels[:2]})
    batches = [{graph_input.name: pixels[i : i + BATCH]} for i in range(0, images, BATCH)]
    batch_s = _timed(session, batches)
    times = _each_timed(session, [{graph_input.name: pixels[i : i + 1]} for i in range(singles)])
    return ImageCeiling(
        provider=session.get_providers()[0],
        batch32_items_per_s=images / batch_s,
        batch1_items_per_s=singles / float(np.sum(times)),
        batch1_p50_ms=float(np.median(times) * 1000.0),
        parallel_items_per_s=parallel,
    )


def _parallel_images(sessions: list, images: int) -> float:
    """Images/s with the images dealt out to ``sessions``, all running at once (0: none)."""
    from concurrent.futures import ThreadPoolExecutor

    cores = len(sessions)
    if not cores:
        return 0.0
    graph_input = sessions[0].get_inputs()[0]
    size = [int(d) for d in graph_input.shape[1:]]
    pixels = np.random.default_rng(1).standard_normal((images, *size)).astype(np.float32)
    shares = np.array_split(pixels, cores)

    def run(pair) -> None:
        session, share = pair
        for i in range(0, len(share), BATCH):
            session.run(None, {graph_input.name: share[i : i + BATCH]})

    with ThreadPoolExecutor(cores) as pool:
        list(pool.map(run, [(s, p[:2]) for s, p in zip(sessions, shares, strict=True)]))
        start = time.perf_counter()
        list(pool.map(run, zip(sessions, shares, strict=True)))
        return images / (time.perf_counter() - start)
