"""In-process rates of the GPU benchmark's graphs, without Triton (``bench.gpu``)."""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from bench.ceiling import config_parameters, make_session, served_tokenizer
from embed_runtime.image.preprocess import PreprocessParams, decode_image, preprocess_opened


def step_onnx(repo: Path, step: str) -> Path:
    """The ONNX graph of the served model ``step`` in ``repo``."""
    return repo / step / "1" / "model.onnx"


def _fixed_rate(session, feed: dict[str, np.ndarray], batch: int, runs: int) -> dict:
    """Rows/s of ``session`` over ``feed`` (``batch`` rows) ``runs`` times, after one warm run."""
    session.run(None, feed)
    start = time.perf_counter()
    for _ in range(runs):
        session.run(None, feed)
    rate = batch * runs / (time.perf_counter() - start)
    return {"provider": session.get_providers()[0], "batch": batch, "items_per_s": round(rate, 1)}


def text_ceiling_gpu(repo: Path, model: str, sentences: list[str]) -> dict:
    """ORT CUDA over the tokenized sentences in length-sorted batches (best batch size)."""
    tokenizer = served_tokenizer(repo, model)
    session = make_session(step_onnx(repo, f"{model}_encode"), "gpu")
    names = {i.name for i in session.get_inputs()}
    arrays = {k: v for k, v in tokenizer.encode(sentences).items() if k in names}
    lengths = arrays["attention_mask"].sum(axis=1)
    order = np.argsort(lengths, kind="stable")
    best: dict = {"provider": session.get_providers()[0], "by_batch": {}}
    for batch in (64, 256, 1024):
        feeds = []
        for i in range(0, len(order), batch):
            rows = order[i : i + batch]
            width = int(lengths[rows].max())
            feeds.append({k: np.ascontiguousarray(v[rows, :width]) for k, v in arrays.items()})
        for feed in feeds[:3]:
            session.run(None, feed)
        start = time.perf_counter()
        for _ in range(3):
            for feed in feeds:
                session.run(None, feed)
        best["by_batch"][batch] = round(3 * len(sentences) / (time.perf_counter() - start), 1)
    best["items_per_s"] = max(best["by_batch"].values())
    return best


def torch_text_rate(text_dir: Path, sentences: list[str]) -> dict:
    """sentence-transformers on the same GPU in fp16, batch 256: the PyTorch way."""
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(text_dir), device="cuda").half()
    model.encode(sentences[:512], batch_size=256)
    torch.cuda.synchronize()
    start = time.perf_counter()
    model.encode(sentences, batch_size=256)
    torch.cuda.synchronize()
    return {"items_per_s": round(len(sentences) / (time.perf_counter() - start), 1)}


def clip_text_ceiling(repo: Path, model: str, batch: int = 256, runs: int = 20) -> dict:
    """ORT CUDA over the CLIP text tower: fixed 77-token rows, ``batch`` per run."""
    session = make_session(step_onnx(repo, f"{model}_encode_text"), "gpu")
    feed = {}
    for graph_input in session.get_inputs():
        width = graph_input.shape[1] if isinstance(graph_input.shape[1], int) else 77
        feed[graph_input.name] = np.random.default_rng(0).integers(1, 40000, (batch, width))
    return _fixed_rate(session, feed, batch, runs)


def image_tower_ceiling(repo: Path, model: str, batch: int = 256, runs: int = 10) -> dict:
    """ORT CUDA over the image tower on ready pixels, ``batch`` images per run."""
    session = make_session(step_onnx(repo, f"{model}_encode_image"), "gpu")
    graph_input = session.get_inputs()[0]
    size = [int(d) for d in graph_input.shape[1:]]
    pixels = np.random.default_rng(0).standard_normal((batch, *size)).astype(np.float32)
    return _fixed_rate(session, {graph_input.name: pixels}, batch, runs)


def _preprocess_share(job) -> int:
    parameters, images, rounds = job
    params = PreprocessParams.from_parameters(parameters)
    for _ in range(rounds):
        for data in images:
            preprocess_opened(decode_image(data, params), params)
    return rounds * len(images)


def preprocess_ceiling(repo: Path, model: str, photos: dict[str, bytes], rounds: int = 8) -> dict:
    """Images/s of ``<model>_preprocess_image``'s decode + preprocess, a process per core."""
    parameters = config_parameters(repo / f"{model}_preprocess_image")
    cores = os.cpu_count() or 1
    images = list(photos.values())
    with ProcessPoolExecutor(cores) as pool:
        list(pool.map(_preprocess_share, [(parameters, images, 1)] * cores))
        start = time.perf_counter()
        done = sum(pool.map(_preprocess_share, [(parameters, images, rounds)] * cores))
        rate = done / (time.perf_counter() - start)
    return {"processes": cores, "items_per_s": round(rate, 1)}
