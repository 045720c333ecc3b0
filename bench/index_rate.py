"""The corpus indexer's rate against the best load, side by side (part of ``make bench``).

    python -m bench.index_rate [--quick] [--rows 4000] [--image-rows 600] [--repeats 3]

Per repeat, in rotation: ``bench.run``'s text loads and ``client.index`` over a JSONL corpus
from the same sentences; then its image loads and the indexer over files and URLs of the
same photos (clip-tiny). Records index / best load per repeat, pooled and the median.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
import tomllib
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from bench.common import logger, write_results
from bench.loads import BenchLoad, image_loads, text_loads
from bench.machine import CpuMonitor, machine_info
from bench.manifest import BUILD, ROOT, TEXT_MODEL, bench_manifest_data, served
from client.index import IndexJob, run_index
from client.load.loadgen import run_triton_load
from client.load.workload import ImageServer, generated_images, text_pool
from generator.admin import KEY_ENV
from generator.manifest import parse_manifest
from generator.triton_local import TritonPorts

log = logger("bench.index_rate")
IMAGE_MODEL = "clip-tiny"  # models.toml's tiny CLIP (make bench writes its checkpoint)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m bench.index_rate")
    parser.add_argument("--quick", action="store_true", help="few rows, 1 repeat")
    parser.add_argument("--rows", type=int, help="corpus rows (default 4000, quick 600)")
    parser.add_argument("--repeats", type=int, help="repeats (default 3, quick 1)")
    parser.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    parser.add_argument("--pool", type=int, default=512, help="distinct sentences")
    parser.add_argument("--concurrency", type=int, help="the indexer's (default: its own)")
    parser.add_argument("--image-rows", type=int, help="image rows (default 600, quick 96)")
    parser.add_argument("--skip-images", action="store_true", help="texts only")
    args = parser.parse_args(argv)
    args.rows = args.rows or (600 if args.quick else 4000)
    args.image_rows = args.image_rows or (96 if args.quick else 600)
    args.repeats = args.repeats or (1 if args.quick else 3)
    return args


def start_triton(stack: ExitStack, images: bool) -> TritonPorts:
    """The bench's text model (and clip-tiny, from models.toml) on free ports."""
    data = bench_manifest_data("cpu")
    data["models"] = data["models"][:1]
    if images:
        project = tomllib.loads((ROOT / "models.toml").read_text())
        data["models"].append(next(m for m in project["models"] if m["name"] == IMAGE_MODEL))
    manifest = parse_manifest(data, ROOT, "index bench manifest")
    names = tuple(n for entry in manifest.models for n in entry.ensembles)
    # its own folder: a build drops the models it does not list
    return stack.enter_context(served(manifest, "bench-index-server", models=names, log=log)).ports


def write_corpus(path: Path, pool: list[str], rows: int) -> None:
    """``rows`` JSONL rows cycling through ``pool``."""
    with path.open("w", encoding="utf-8") as handle:
        for i in range(rows):
            handle.write(json.dumps({"id": f"r{i}", "text": pool[i % len(pool)]}) + "\n")


def best_load(url: str, protocol: str, loads: list[BenchLoad], inputs) -> dict:
    """Each load's rate and the best one's; ``inputs(load)``: (ensemble, input, requests)."""
    rates = {}
    for load in loads:
        model, name, requests = inputs(load)
        result = run_triton_load(url, protocol, model, name, requests, load.spec, load.key)
        rates[load.key] = result.items_per_s
        log(f"  load {load.key:12s} {result.items_per_s:8.1f} rows/s")
    best = max(rates, key=rates.get)
    return {"best": best, "best_rows_per_s": rates[best], "loads": rates}


def write_image_table(folder: Path, photos: dict[str, bytes], urls: list[str], rows: int) -> Path:
    """A JSONL table of ``rows`` images: even rows a file of ``folder``, odd rows a URL."""
    names = sorted(photos)
    for name in names:
        (folder / name).write_bytes(photos[name])
    table = folder / "images.jsonl"
    with table.open("w", encoding="utf-8") as handle:
        for i in range(rows):
            image = names[i % len(names)] if i % 2 == 0 else urls[i % len(urls)]
            handle.write(json.dumps({"id": f"i{i}", "image": image}) + "\n")
    return table


def index_once(
    url: str,
    protocol: str,
    corpus: Path,
    out: Path,
    concurrency: int | None,
    images: bool = False,
) -> dict:
    """One indexer run into a fresh ``out``; its rate over the whole run."""
    shutil.rmtree(out, ignore_errors=True)
    job = IndexJob(
        model=IMAGE_MODEL if images else TEXT_MODEL,
        inputs=[str(corpus)],
        out=str(out),
        url=url,
        protocol=protocol,
        admin_key=os.environ[KEY_ENV],
        images=images,
        image_column="image" if images else None,
        shard_rows=1000,
        concurrency=concurrency,
        progress="quiet",
    )
    summary = run_index(job)
    if summary.total_errors:
        raise RuntimeError(f"{summary.total_errors} rows failed")
    log(f"  index    {summary.rows_per_s:8.1f} rows/s ({summary.rows} rows, "
        f"{summary.concurrency} in flight x {summary.batch_rows} rows, "
        f"{summary.retries} requests retried, {summary.resent} batches resent)")  # fmt: skip
    keys = ("rows_per_s", "rows", "seconds", "concurrency", "batch_rows", "retries", "resent")
    return {key: getattr(summary, key) for key in keys}


def _ratios(repeats: list[dict], index: str, load: str) -> dict:
    """Per repeat, pooled and median ratios of ``index`` over ``load``."""
    ratios = [r[index]["rows_per_s"] / r[load]["best_rows_per_s"] for r in repeats]
    pooled = statistics.mean(r[index]["rows_per_s"] for r in repeats) / statistics.mean(
        r[load]["best_rows_per_s"] for r in repeats
    )
    per_repeat = ", ".join(f"{x:.2f}" for x in ratios)
    log(f"{index} / best {load}: pooled {pooled:.2f}x, median "
        f"{statistics.median(ratios):.2f}x; per repeat {per_repeat}")  # fmt: skip
    return {"per_repeat": ratios, "pooled": pooled, "median": statistics.median(ratios)}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; write the results file."""
    args = parse_args(argv)
    pool = text_pool(args.pool)
    work = BUILD / "bench-index"
    shutil.rmtree(work, ignore_errors=True)
    (work / "images").mkdir(parents=True)
    corpus = work / "corpus.jsonl"
    write_corpus(corpus, pool, args.rows)
    photos = generated_images()
    repeats = []
    monitor = CpuMonitor()
    with ExitStack() as stack:
        ports = start_triton(stack, not args.skip_images)
        url = f"127.0.0.1:{ports.http if args.protocol == 'http' else ports.grpc}"
        urls = stack.enter_context(ImageServer(photos)).urls()
        table = write_image_table(work / "images", photos, urls, args.image_rows)
        out = work / "out"
        steps = {
            "load": lambda: best_load(
                url, args.protocol, text_loads(args.quick),
                lambda load: (TEXT_MODEL, "TEXT", load.text_requests(pool)),
            ),
            "index": lambda: index_once(url, args.protocol, corpus, out, args.concurrency),
            "image_load": lambda: best_load(
                url, args.protocol, image_loads(args.quick),
                lambda load: load.image_requests(IMAGE_MODEL, urls, photos),
            ),
            "image_index": lambda: index_once(
                url, args.protocol, table, out, args.concurrency, images=True
            ),
        }  # fmt: skip
        order = list(steps)[: 2 if args.skip_images else 4]
        index_once(url, args.protocol, corpus, work / "warmup", args.concurrency)
        if not args.skip_images:
            index_once(url, args.protocol, table, work / "warmup", args.concurrency, images=True)
        for repeat in range(args.repeats):
            log(f"repeat {repeat + 1}/{args.repeats}")
            record: dict = {}
            shift = repeat % len(order)
            for step in order[shift:] + order[:shift]:
                monitor.start()
                record[step] = steps[step]()
                record[step]["foreign_cpu"] = monitor.stop().foreign_share
                log(f"  {step:12s} foreign cpu {record[step]['foreign_cpu']:.0%}")
            repeats.append(record)
    text = _ratios(repeats, "index", "load")
    images = None if args.skip_images else _ratios(repeats, "image_index", "image_load")
    results = {
        "command": "python -m bench.index_rate " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(),
        "model": TEXT_MODEL,
        "image_model": None if args.skip_images else IMAGE_MODEL,
        "protocol": args.protocol,
        "rows": args.rows,
        "image_rows": args.image_rows,
        "repeats": repeats,
        "text": text,
        "images": images,
    }
    stamp = time.strftime("%Y-%m-%dT%H%M%SZ", time.gmtime())
    log(f"wrote {write_results(results, f'index-rate-{stamp}', args.quick)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
