r"""What the ``bench`` and ``perf-data`` subcommands of ``python -m client`` run.

    python -m client bench --model all-MiniLM-L6-v2 --clients 16 --texts-per-request 1 \
        --requests 200 --protocol grpc [--json out.json]
    python -m client bench --model clip-vit-b-32 --images 1 --mode url --clients 8
    python -m client perf-data --out perf-data --model-kind clip \
        --image-base-url http://127.0.0.1:8080

``bench --mode url`` serves the generated photos from 127.0.0.1 on a free port; the
server's ``fetch_image`` must allow that address (``[fetch_image] allow_hosts``).
Their arguments are declared in :mod:`client.bench_cli`; :mod:`client.cli` imports this
module only when one of them runs.
"""

from __future__ import annotations

import argparse
import json
from contextlib import ExitStack
from pathlib import Path

from ..payload import image_target
from .loadgen import LoadResult, LoadSpec, format_result, run_triton_load
from .perf_data import perf_analyzer_commands, write_perf_data
from .workload import ImageServer, generated_images, image_requests, text_pool, text_requests


def image_ensemble(model: str, mode: str) -> tuple[str, str]:
    """``(ensemble, input name)`` for a CLIP image load in ``mode`` (``bytes`` or ``url``)."""
    base, forced = image_target(model)
    kind = forced or ("image_url" if mode == "url" else "image")
    return f"{base}_{kind}", "IMAGE_URL" if kind == "image_url" else "IMAGE"


def run_bench(args: argparse.Namespace, url: str) -> int:
    """Run one load against Triton at ``url`` and print (and optionally save) the result."""
    items = args.images or args.texts_per_request
    spec = LoadSpec(args.clients, items, args.requests, args.warmup, args.max_seconds)
    count = max(args.clients * (args.requests + args.warmup), 1)
    with ExitStack() as stack:
        if args.images:
            model, input_name = image_ensemble(args.model, args.mode)
            photos = generated_images()
            if input_name == "IMAGE_URL":
                server = stack.enter_context(ImageServer(photos))
                pool = [u.encode() for u in server.urls()]
            else:
                pool = [photos[name] for name in sorted(photos)]
            requests = image_requests(pool, args.images, count)
            unit = "images"
        else:
            model, input_name, unit = args.model, "TEXT", "texts"
            requests = text_requests(text_pool(args.pool), args.texts_per_request, count)
        result = run_triton_load(url, args.protocol, model, input_name, requests, spec)
    print(f"{model} over {args.protocol} at {url}")
    print(format_result(result, unit))
    if args.json_out:
        _save(result, Path(args.json_out), model=model, protocol=args.protocol, url=url)
    return 1 if result.errors and not result.requests else 0


def _save(result: LoadResult, path: Path, **meta: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**meta, **result.to_dict()}, indent=2) + "\n")


def run_perf_data(args: argparse.Namespace) -> int:
    """Write the input-data files and print the matching perf_analyzer command lines."""
    out = Path(args.out)
    written = write_perf_data(out, args.model_kind, args.image_base_url, args.texts, args.images)
    files = [p for p in written if p.suffix == ".json"]
    print(f"wrote {', '.join(str(p) for p in files)} ({len(written) - len(files)} images)")
    model = args.model or ("all-MiniLM-L6-v2" if args.model_kind == "text" else "clip-vit-b-32")
    print("perf_analyzer (SDK container, data mounted at /data):")
    for command in perf_analyzer_commands(model, args.model_kind):
        print(f"  {command}")
    return 0
