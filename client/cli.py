"""Command line over :class:`EmbeddingClient`.

    python -m client embed --model all-MiniLM-L6-v2 "some text" "more text"
    python -m client embed --model clip-vit-b-32 --image cat.jpg --image https://host/dog.png
    python -m client embed --model clip-vit-b-32_text "a photo of a cat" --format npy --out t.npy
    python -m client rerank --model rerank-tiny --query "what is triton?" "a server" "a fish"
    python -m client models
    python -m client stats [--model M] [--json]
    python -m client ready [--model M]
    python -m client manage '{"action": "list"}'     # model_manager (needs the admin key)
    python -m client bench --model M --clients 16 --texts-per-request 1 --requests 200
    python -m client perf-data --out DIR --model-kind text|clip
    python -m client index --model all-MiniLM-L6-v2 docs.jsonl --out out/   # docs/indexing.md

``bench`` and ``perf-data`` run load generation (:mod:`client.load`), imported only when
one of them runs.

Global options (before or after the command): ``--url`` (default: ``$TRITON_URL``, else
localhost:8000, or localhost:8001 with ``--protocol grpc``), ``--protocol``, ``--timeout``
(the call's deadline), ``--no-retry`` (refusals are retried within the deadline and a
retry budget unless given), ``--admin-key``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import bench_cli, rerank_cli
from .api import EmbeddingClient, default_url
from .cli_options import add_text_options
from .errors import EmbeddingClientError
from .index import cli as index_cli
from .records import ModelInfo, ModelStats
from .retry import DEFAULT_RETRY

URL_ENV = "TRITON_URL"


def _add_global_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--url", default=default(None), help=f"host:port (default: ${URL_ENV} or localhost)"
    )
    parser.add_argument("--protocol", choices=["http", "grpc"], default=default("http"))
    parser.add_argument(
        "--timeout",
        type=float,
        default=default(60.0),
        help="deadline of the command's call in seconds, retries included (default 60)",
    )
    parser.add_argument(
        "--no-retry",
        action="store_true",
        default=default(False),
        help="send each request once: a refusal (server full) fails at once",
    )
    parser.add_argument(
        "--admin-key",
        default=default(None),
        help="X-Admin-Key for models / manage (default: $EMBED_ADMIN_KEY or the file "
        "$EMBED_ADMIN_KEY_FILE)",
    )


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser (global options are accepted before or after the command)."""
    parser = argparse.ArgumentParser(
        prog="python -m client", description="Embed with, and inspect, a Triton server."
    )
    _add_global_options(parser, suppress=False)
    common = argparse.ArgumentParser(add_help=False)
    _add_global_options(common, suppress=True)
    sub = parser.add_subparsers(dest="command", required=True)

    embed = sub.add_parser("embed", parents=[common], help="print embeddings")
    embed.add_argument("--model", required=True, help="text model, <clip>_text, or <clip>")
    embed.add_argument("texts", nargs="*", metavar="TEXT", help="texts to embed")
    embed.add_argument(
        "--image",
        action="append",
        default=[],
        dest="images",
        metavar="PATH_OR_URL",
        help="image file or http(s)/data: URL (repeatable; --model is the CLIP name)",
    )
    embed.add_argument(
        "--text-file",
        action="append",
        default=[],
        metavar="PATH",
        help="a UTF-8 file embedded as one text, however long (repeatable)",
    )
    embed.add_argument(
        "--sparse",
        action="store_true",
        help="a sparse-encoder model: print each text's active indices and values (json)",
    )
    embed.add_argument(
        "--multivector",
        choices=["query", "document"],
        help="a multi-vector (ColBERT) model: print each text's token vectors (json), "
        "encoded as queries or documents",
    )
    add_text_options(
        embed,
        precision="float32",
        per_chunk="printed one line each: its row, span, tokens and vector; the server cuts them",
    )
    embed.add_argument(
        "--long-text",
        choices=["mean"],
        help="one vector per text however long: the token-weighted mean of its chunks",
    )
    embed.add_argument("--format", choices=["json", "npy"], default="json")
    embed.add_argument("--out", help="write here instead of stdout (required for npy)")

    sub.add_parser("models", parents=[common], help="list the model repository")
    stats = sub.add_parser("stats", parents=[common], help="summarise inference statistics")
    stats.add_argument("--model", help="one model (default: all)")
    stats.add_argument("--json", action="store_true", help="one JSON object per line")
    ready = sub.add_parser("ready", parents=[common], help="exit 0 if ready, 1 if not")
    ready.add_argument("--model", help="check this model instead of the server")
    manage = sub.add_parser(
        "manage", parents=[common], help="send one JSON request to model_manager"
    )
    manage.add_argument("request", help='e.g. \'{"action": "list"}\'')
    bench_cli.add_parsers(sub, common)
    rerank_cli.add_parser(sub, common)
    index_cli.add_parser(sub, common)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and check ``argv``; exits with a usage error on bad combinations."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "embed":
        for path in args.text_file:
            try:
                args.texts.append(Path(path).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as exc:
                parser.error(f"embed: cannot read --text-file {path}: {exc}")
        chunked = args.chunk_tokens is not None or args.chunk_overlap is not None
        if (chunked or args.long_text) and (
            args.images or args.sparse or args.multivector or args.precision != "float32"
        ):
            parser.error("embed: chunk options apply to dense text models, float32 only")
        if bool(args.texts) == bool(args.images):
            parser.error("embed: give either texts or --image, not both or neither")
        if args.format == "npy" and not args.out:
            parser.error("embed: --format npy needs --out")
        if args.images and (
            args.prompt_name is not None
            or args.dimensions is not None
            or args.precision != "float32"
        ):
            parser.error("embed: --prompt-name, --dimensions and --precision apply to texts only")
    return args


def resolve_url(url: str | None, protocol: str, environ: Mapping[str, str]) -> str:
    """Pick the server address: ``--url``, else ``$TRITON_URL``, else the protocol default."""
    return url or environ.get(URL_ENV) or default_url(protocol)


def format_models(models: Sequence[ModelInfo]) -> str:
    """Render the repository index as an aligned table."""
    rows = [("NAME", "VERSION", "STATE", "REASON")]
    rows += [(m.name, m.version, m.state, m.reason) for m in models]
    return _table(rows)


def format_stats(stats: Sequence[ModelStats]) -> str:
    """Render statistics summaries as an aligned table (times in ms)."""
    rows = [tuple("MODEL VER INFER EXEC OK FAIL REQ QUEUE INPUT COMPUTE OUTPUT BATCHES".split())]
    for s in stats:
        batches = " ".join(f"{size}:{count}" for size, count in s.batch_sizes.items())
        rows.append(
            (
                s.name,
                s.version,
                str(s.inference_count),
                str(s.execution_count),
                str(s.success_count),
                str(s.fail_count),
                f"{s.avg_request_ms:.2f}",
                f"{s.avg_queue_ms:.2f}",
                f"{s.avg_compute_input_ms:.2f}",
                f"{s.avg_compute_infer_ms:.2f}",
                f"{s.avg_compute_output_ms:.2f}",
                batches or "-",
            )
        )
    return _table(rows)


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def _write_json_lines(records: Iterable[dict[str, Any]], out: str | None) -> None:
    """One JSON object per line, to the file ``out`` or to standard output."""
    lines = [json.dumps(record) + "\n" for record in records]
    if out:
        with open(out, "w", encoding="utf-8") as stream:
            stream.writelines(lines)
    else:
        sys.stdout.writelines(lines)


def _cmd_embed_sparse(client: EmbeddingClient, args: argparse.Namespace) -> int:
    if args.images or args.dimensions is not None or args.format != "json":
        raise SystemExit("--sparse takes texts only, printed as json (no --image, --dimensions)")
    rows = client.embed_sparse(args.model, args.texts, prompt_name=args.prompt_name)
    _write_json_lines(
        (
            {"input": text, "indices": i.tolist(), "values": v.tolist()}
            for text, (i, v) in zip(args.texts, rows, strict=True)
        ),
        args.out,
    )
    return 0


def _cmd_embed_multivector(client: EmbeddingClient, args: argparse.Namespace) -> int:
    if args.images or args.dimensions is not None or args.prompt_name or args.format != "json":
        raise SystemExit(
            "--multivector takes texts only, printed as json (no --image, "
            "--dimensions, --prompt-name)"
        )
    is_query = args.multivector == "query"
    rows = client.embed_multivector(args.model, args.texts, is_query=is_query)
    _write_json_lines(
        (
            {"input": text, "task": args.multivector, "embeddings": r.tolist()}
            for text, r in zip(args.texts, rows, strict=True)
        ),
        args.out,
    )
    return 0


def _cmd_embed_chunks(client: EmbeddingClient, args: argparse.Namespace) -> int:
    options = {
        "chunk_tokens": args.chunk_tokens,
        "chunk_overlap": args.chunk_overlap,
        "prompt_name": args.prompt_name,
        "dimensions": args.dimensions,
    }
    chunks = client.embed_chunks(args.model, args.texts, **options)
    if args.format == "npy":
        vectors = np.stack([c.vector for c in chunks])
        np.save(args.out, vectors)
        print(f"wrote {vectors.shape[0]}x{vectors.shape[1]} chunk vectors to {args.out}",
              file=sys.stderr)
        return 0
    _write_json_lines(
        (
            {"row": c.row, "start": c.start, "end": c.end, "tokens": c.tokens,
             "embedding": c.vector.tolist()}
            for c in chunks
        ),
        args.out,
    )
    return 0


def _cmd_embed(client: EmbeddingClient, args: argparse.Namespace) -> int:
    if args.long_text is None and (
        args.chunk_tokens is not None or args.chunk_overlap is not None
    ):
        return _cmd_embed_chunks(client, args)
    if args.sparse:
        return _cmd_embed_sparse(client, args)
    if args.multivector:
        return _cmd_embed_multivector(client, args)
    if args.images:
        inputs, vectors = args.images, client.embed_images(args.model, args.images)
    else:
        options = {
            "prompt_name": args.prompt_name,
            "dimensions": args.dimensions,
            "precision": args.precision,
        }
        if args.long_text:
            del options["precision"]
            options.update(chunk_tokens=args.chunk_tokens, chunk_overlap=args.chunk_overlap)
            vectors = client.embed_long_texts(args.model, args.texts, **options)
        else:
            vectors = client.embed_texts(args.model, args.texts, **options)
        inputs = args.texts
    if args.format == "npy":
        np.save(args.out, vectors)
        shape = f"{vectors.shape[0]}x{vectors.shape[1]} {vectors.dtype}"
        print(f"wrote {shape} to {args.out}", file=sys.stderr)
    else:
        _write_json_lines(
            (
                {"input": item, "embedding": vector.tolist()}
                for item, vector in zip(inputs, vectors, strict=True)
            ),
            args.out,
        )
    return 0


def _cmd_stats(client: EmbeddingClient, args: argparse.Namespace) -> int:
    stats = client.model_statistics(args.model)
    if args.json:
        for s in stats:
            print(json.dumps(dataclasses.asdict(s)))
    else:
        print(format_stats(stats))
    return 0


def _cmd_ready(client: EmbeddingClient, args: argparse.Namespace) -> int:
    ok = client.is_model_ready(args.model) if args.model else client.is_server_ready()
    subject = f"model {args.model}" if args.model else f"server {client.url}"
    print(f"{subject}: {'ready' if ok else 'not ready'}")
    return 0 if ok else 1


def _cmd_manage(client: EmbeddingClient, args: argparse.Namespace) -> int:
    try:
        request = json.loads(args.request)
    except json.JSONDecodeError as exc:
        raise EmbeddingClientError(f"REQUEST is not valid JSON: {exc}") from None
    if not isinstance(request, dict):
        raise EmbeddingClientError("REQUEST must be a JSON object")
    print(json.dumps(client.manage(request), indent=2))
    return 0


def _run_load_command(args: argparse.Namespace, url: str) -> int:
    from .load import commands  # noqa: PLC0415 - load generation only for the commands that use it

    if args.command == "perf-data":
        return commands.run_perf_data(args)
    try:
        return commands.run_bench(args, url)
    except EmbeddingClientError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the CLI; return the exit code (1 with Triton's message on stderr on error)."""
    args = parse_args(argv)
    url = resolve_url(args.url, args.protocol, os.environ if environ is None else environ)
    if args.command in bench_cli.COMMANDS:
        return _run_load_command(args, url)
    if args.command == "index":
        return index_cli.run(args, url)
    try:
        retry = None if args.no_retry else DEFAULT_RETRY
        with EmbeddingClient(
            url, args.protocol, args.timeout, admin_key=args.admin_key, retry=retry
        ) as client:
            if args.command == "manage":
                return _cmd_manage(client, args)
            if args.command == "embed":
                return _cmd_embed(client, args)
            if args.command == "rerank":
                return rerank_cli.run(client, args)
            if args.command == "models":
                print(format_models(client.list_models()))
                return 0
            if args.command == "stats":
                return _cmd_stats(client, args)
            return _cmd_ready(client, args)
    except EmbeddingClientError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
