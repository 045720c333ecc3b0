"""Where the GPU time of a small text encoder goes, in-process: ``python -m bench.gpu.fusion``.

The served e5-small-sized encoder left the GPU "busy" (nvidia-smi) at 77-85 % while
serving about 11,000 sentences/s, which is what one ORT CUDA session gave in-process:
the GPU work per sentence is the bound. This study measures, on one device and one
graph, what cuts that work:

* ``plain``: the fp16 graph as the generator ships it (every op of the export in half
  precision; ONNX Runtime's own online fusions at load time);
* ``fused``: ONNX Runtime's transformer optimiser run on the validated fp32 graph first
  (fused attention, SkipLayerNormalization, BiasGelu, EmbedLayerNormalization), then the
  same fp16 conversion;

each at several batch sizes over length-sorted sentences (the served encoder's chunks),
checked against sentence-transformers in fp32 on the same GPU, and run from 1, 4 and 8
processes at once (Triton's encoder instances are processes; without MPS their kernels
take turns on the GPU), with and without the CUDA MPS daemon when the host has one.
Writes ``<out>/gpu-fusion-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from bench.common import logger
from bench.manifest import BUILD

log = logger("gpu-fusion")
FUSED_OPS = (
    "Attention",
    "MultiHeadAttention",
    "SkipLayerNormalization",
    "LayerNormalization",
    "EmbedLayerNormalization",
    "BiasGelu",
    "FastGelu",
    "Gelu",
    "MatMul",
    "Softmax",
)


def op_counts(path: Path) -> dict[str, int]:
    """How many nodes of each interesting type the graph at ``path`` holds, and in all."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    counts = Counter(node.op_type for node in model.graph.node)
    return {"nodes": len(model.graph.node), **{op: counts[op] for op in FUSED_OPS if counts[op]}}


def make_variants(fp32: Path, out: Path, heads: int, hidden: int) -> dict[str, Path]:
    """The plain fp16 graph and the fused fp16 graph beside ``fp32``."""
    from generator.precision import convert_fp16, fuse_transformer

    out.mkdir(parents=True, exist_ok=True)
    plain, fused32, fused = out / "plain.onnx", out / "fused32.onnx", out / "fused.onnx"
    convert_fp16(fp32, plain)
    fuse_transformer(fp32, fused32, "bert", heads, hidden, fp16=False)
    convert_fp16(fused32, fused)
    return {"plain": plain, "fused": fused}


def _sorted_batches(arrays: dict, batch: int) -> Iterator[tuple[np.ndarray, dict]]:
    """``(rows, feed)`` per length-sorted batch of ``batch`` rows, cut to its own longest row."""
    lengths = arrays["attention_mask"].sum(axis=1)
    order = np.argsort(lengths, kind="stable")
    for i in range(0, len(order), batch):
        rows = order[i : i + batch]
        width = int(lengths[rows].max())
        yield rows, {k: np.ascontiguousarray(v[rows, :width]) for k, v in arrays.items()}


def sorted_feeds(arrays: dict, batch: int) -> list[dict]:
    """Length-sorted batches of ``batch`` rows, each cut to its own longest row."""
    return [feed for _, feed in _sorted_batches(arrays, batch)]


def embed_all(session, arrays: dict, batch: int = 64) -> np.ndarray:
    """Every sentence's embedding, in input order."""
    rows_out = [(rows, session.run(None, feed)[0]) for rows, feed in _sorted_batches(arrays, batch)]
    width = rows_out[0][1].shape[1]
    out = np.zeros((len(arrays["attention_mask"]), width), dtype=np.float64)
    for rows, values in rows_out:
        out[rows] = values
    return out


def rate(session, feeds: list[dict], rounds: int = 3) -> float:
    """Sentences per second over ``feeds`` (after one warm-up pass)."""
    for feed in feeds:
        session.run(None, feed)
    rows = sum(len(f["input_ids"]) for f in feeds)
    start = time.perf_counter()
    for _ in range(rounds):
        for feed in feeds:
            session.run(None, feed)
    return rounds * rows / (time.perf_counter() - start)


def _worker(job) -> tuple[float, float, int]:
    path, arrays, batch, rounds, barrier = job
    from bench.ceiling import make_session

    session = make_session(Path(path), "gpu")
    feeds = sorted_feeds(arrays, batch)
    for feed in feeds:
        session.run(None, feed)
    barrier.wait()
    start = time.perf_counter()
    for _ in range(rounds):
        for feed in feeds:
            session.run(None, feed)
    return start, time.perf_counter(), rounds * sum(len(f["input_ids"]) for f in feeds)


def processes_rate(path: Path, arrays: dict, batch: int, processes: int, rounds: int) -> float:
    """Sentences per second of ``processes`` sessions in as many processes, side by side."""
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(processes)
        with ctx.Pool(processes) as pool:
            spans = pool.map(_worker, [(str(path), arrays, batch, rounds, barrier)] * processes)
    start = min(s for s, _, _ in spans)
    end = max(e for _, e, _ in spans)
    return sum(n for _, _, n in spans) / (end - start)


def mps(action: str) -> bool:
    """Start (``"start"``) or stop the CUDA MPS daemon; False when the host has none."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        return False
    if action == "start":
        return subprocess.run([control, "-d"], capture_output=True).returncode == 0
    subprocess.run([control], input=b"quit\n", capture_output=True)
    time.sleep(1)
    return True


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu.fusion", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", type=Path, default=BUILD / "gpu-results")
    parser.add_argument("--tokenizer", type=Path, help="BERT tokenizer folder (default MiniLM)")
    parser.add_argument("--sentences", type=int, default=2048)
    for name, default in (("shapes", "e5-small minilm-l6 e5-base"), ("batches", "16 64 256"),
                          ("processes", "1 4 8")):
        parser.add_argument(f"--{name}", default=default, help=f"default {default!r}")
    parser.add_argument("--torch-device", default="cuda", help="where the reference runs")
    parser.add_argument(
        "--shape-costs",
        action="store_true",
        help="only the cost of new input shapes per attention kernel",
    )
    parser.add_argument("--mps", action="store_true", help="repeat the process runs under MPS")
    return parser.parse_args(argv)


def study_shape(args, shape: str, sentences: list[str]) -> dict:
    """Both graphs of one model shape: op counts, parity, rates."""
    import onnxruntime as ort  # noqa: F401 - fail early without it
    from sentence_transformers import SentenceTransformer

    from bench.ceiling import make_session
    from generator.families.sentence_transformers import export as st_export
    from generator.families.text_export import load_on_cpu
    from generator.fixtures.random_text import SHAPES, create_random_text_model
    from generator.onnx_export import export_module

    dims = SHAPES[shape]
    text_dir = create_random_text_model(BUILD / "gpu" / f"{shape}-random", shape, args.tokenizer)
    model = load_on_cpu(SentenceTransformer, str(text_dir))
    work = BUILD / "gpu" / "fusion" / shape
    work.mkdir(parents=True, exist_ok=True)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    spec = st_export._graph_spec(names, model.get_embedding_dimension())
    encoder = st_export._encoder_module(model, names, None)
    fp32 = work / "fp32.onnx"
    sample = model.preprocess(sentences[:3])
    export_module(encoder, spec, {n: sample[n] for n in names}, fp32)
    paths = make_variants(fp32, work, dims.heads, dims.hidden)
    features = model.tokenizer(
        sentences,
        padding=True,
        truncation=True,
        max_length=dims.max_seq_length,
        return_tensors="np",
    )
    arrays = {n: features[n].astype(np.int64) for n in names}
    reference = (
        SentenceTransformer(str(text_dir), device=args.torch_device)
        .encode(sentences, batch_size=64, convert_to_numpy=True)
        .astype(np.float64)
    )
    result: dict = {"shape": vars(dims) if hasattr(dims, "__dict__") else str(dims)}
    batches = [int(b) for b in args.batches.split()]
    for name, path in paths.items():
        session = make_session(path, "gpu")
        got = embed_all(session, arrays)
        cosine = np.sum(got * reference, 1) / (
            np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1)
        )
        entry = {
            "provider": session.get_providers()[0],
            "ops": op_counts(path),
            "min_cosine": float(cosine.min()),
            "max_abs": float(np.abs(got - reference).max()),
            "by_batch": {b: round(rate(session, sorted_feeds(arrays, b)), 1) for b in batches},
        }
        del session
        log(f"{shape} {name}: {entry}")
        result[name] = entry
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Run the study; writes its results file."""
    args = parse_args(argv)
    from bench.machine import gpu_facts
    from client.load.workload import text_pool

    started = time.strftime("%Y-%m-%dT%H%M%SZ", time.gmtime())
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) for k, v in vars(args).items()}
    results: dict = {"meta": {"started": started, "args": settings, "machine": gpu_facts()}}
    sentences = text_pool(args.sentences)
    path = args.out / f"gpu-fusion-{started}.json"

    def save() -> None:
        path.write_text(json.dumps(results, indent=1) + "\n")

    if args.shape_costs:
        shape = args.shapes.split()[0]
        work = BUILD / "gpu" / "fusion" / shape
        if not (work / "fused.onnx").is_file():
            results["shapes"] = {shape: study_shape(args, shape, sentences[:256])}
        results["shape_costs"] = {g: shape_costs(work / f"{g}.onnx") for g in ("fused", "plain")}
        save()
        return 0
    results["shapes"] = {}
    for shape in args.shapes.split():
        results["shapes"][shape] = study_shape(args, shape, sentences)
        save()
    # Processes side by side, e5-small (the first shape), batch 64 (about what a served
    # execution carries), each graph; then the same under MPS.
    shape = args.shapes.split()[0]
    work = BUILD / "gpu" / "fusion" / shape
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(BUILD / "gpu" / f"{shape}-random"))
    features = tokenizer(
        sentences[:512], padding=True, truncation=True, max_length=512, return_tensors="np"
    )
    arrays = {
        n: features[n].astype(np.int64) for n in ("input_ids", "attention_mask", "token_type_ids")
    }
    runs = results["processes"] = []
    modes = ["default"] + (["mps"] if args.mps else [])
    for mode in modes:
        if mode == "mps" and not mps("start"):
            runs.append({"mode": mode, "error": "no nvidia-cuda-mps-control or it failed"})
            continue
        try:
            for graph in ("plain", "fused"):
                for count in (int(p) for p in args.processes.split()):
                    value = processes_rate(work / f"{graph}.onnx", arrays, 64, count, rounds=10)
                    runs.append(
                        {
                            "mode": mode,
                            "graph": graph,
                            "processes": count,
                            "items_per_s": round(value, 1),
                        }
                    )
                    log(f"{mode} {graph} x{count}: {value:,.0f}/s")
                    save()
        finally:
            if mode == "mps":
                mps("stop")
    save()
    log(f"results: {path}")
    return 0


# Attention kernels of ONNX Runtime's CUDA provider, chosen by environment variables read
# once per process (0: the provider's own choice).
KERNEL_ENVS = {
    "default": {},
    "no-trt-fused": {"ORT_DISABLE_FUSED_ATTENTION": "1", "ORT_DISABLE_TRT_FLASH_ATTENTION": "1"},
    "efficient-only": {
        "ORT_DISABLE_FUSED_ATTENTION": "1",
        "ORT_DISABLE_TRT_FLASH_ATTENTION": "1",
        "ORT_DISABLE_FLASH_ATTENTION": "1",
    },
    "unfused": {
        "ORT_DISABLE_FUSED_ATTENTION": "1",
        "ORT_DISABLE_TRT_FLASH_ATTENTION": "1",
        "ORT_DISABLE_FLASH_ATTENTION": "1",
        "ORT_DISABLE_MEMORY_EFFICIENT_ATTENTION": "1",
    },
}


def _shape_costs(job) -> dict:
    path, env = job
    import os

    os.environ.update(env)
    from bench.ceiling import make_session

    session = make_session(Path(path), "gpu")
    rng = np.random.default_rng(0)

    def feed(rows: int, width: int) -> dict:
        return {
            "input_ids": rng.integers(1000, 20000, (rows, width)).astype(np.int64),
            "attention_mask": np.ones((rows, width), np.int64),
            "token_type_ids": np.zeros((rows, width), np.int64),
        }

    def timed(f: dict) -> float:
        start = time.perf_counter()
        session.run(None, f)
        return (time.perf_counter() - start) * 1000

    timed(feed(8, 8))
    first = [timed(feed(32, w)) for w in range(10, 50)]  # a new width each run
    again = [timed(feed(32, w)) for w in range(10, 50)]  # the same shapes again
    new_rows = [timed(feed(r, 30)) for r in range(33, 73)]  # seen width, new row counts
    return {
        "new_width_ms": round(float(np.median(first)), 2),
        "same_shape_ms": round(float(np.median(again)), 2),
        "new_rows_ms": round(float(np.median(new_rows)), 2),
    }


def shape_costs(path: Path) -> dict:
    """Median ms of a run at a width never seen, at a seen shape, at new row counts."""
    ctx = mp.get_context("spawn")
    out = {}
    for name, env in KERNEL_ENVS.items():
        with ctx.Pool(1) as pool:
            out[name] = pool.map(_shape_costs, [(str(path), env)])[0]
        log(f"shape costs {path.name} {name}: {out[name]}")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
