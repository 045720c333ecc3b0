"""Arguments of the ``bench`` and ``perf-data`` subcommands of ``python -m client``.

Only the arguments live here: what the commands run is load generation
(:mod:`client.load.commands`), which :mod:`client.cli` imports only when one of them
runs, so ``embed``, ``models`` and the rest never load it.
"""

from __future__ import annotations

import argparse

COMMANDS = ("bench", "perf-data")
KINDS = ("text", "clip")
DEFAULT_IMAGE_BASE_URL = "http://127.0.0.1:8080"


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register ``bench`` and ``perf-data`` on the CLI's subparsers."""
    bench = sub.add_parser("bench", parents=[common], help="closed-loop load test of a model")
    bench.add_argument("--model", required=True, help="text ensemble, or CLIP name with --images")
    bench.add_argument("--clients", type=int, default=16, help="concurrent clients (threads)")
    bench.add_argument("--texts-per-request", type=int, default=1)
    bench.add_argument("--requests", type=int, default=200, help="timed requests per client")
    bench.add_argument("--warmup", type=int, default=2, help="untimed requests per client")
    bench.add_argument("--max-seconds", type=float, default=60.0, help="stop the load after this")
    bench.add_argument("--images", type=int, default=0, help="images per request (image load)")
    bench.add_argument("--mode", choices=["bytes", "url"], default="bytes", help="image input")
    bench.add_argument("--pool", type=int, default=512, help="distinct sentences in the workload")
    bench.add_argument("--json", dest="json_out", help="also write the result here")

    perf = sub.add_parser(
        "perf-data", parents=[common], help="write perf_analyzer --input-data files"
    )
    perf.add_argument("--out", required=True, help="folder for the JSON files (and images/)")
    perf.add_argument("--model-kind", choices=KINDS, default="text")
    perf.add_argument("--model", help="model name used in the printed perf_analyzer commands")
    perf.add_argument("--image-base-url", default=DEFAULT_IMAGE_BASE_URL)
    perf.add_argument("--texts", type=int, default=256, help="text entries to write")
    perf.add_argument("--images", type=int, default=12, help="photos to generate")
