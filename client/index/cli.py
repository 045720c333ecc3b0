"""``python -m client index``: the command line of :func:`client.index.run_index`.

    python -m client index --model all-MiniLM-L6-v2 docs.jsonl --out out/
    python -m client index --model clip-vit-b-32 --images photos/ --out out/ --qdrant http://q:6333
    python -m client index --model clip-vit-b-32 --image-column url urls.parquet --out out/
    python -m client index --model all-MiniLM-L6-v2 docs/ --out /mnt/out \
        --url triton-a:8000,triton-b:8000 --spark local[4]

Exit status: 0 when every row was embedded, 1 when some rows failed (counts printed; the
rows are in OUT/errors), 2 when the run stopped (unknown model, changed output, server
gone): run the same command again to resume.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..cli_options import add_text_options
from ..errors import EmbeddingClientError

EXIT_ROWS_FAILED = 1
EXIT_STOPPED = 2


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``index`` subcommand."""
    index = sub.add_parser(
        "index",
        parents=[common],
        help="embed a corpus into Parquet shards (resumable; optionally Qdrant)",
        description=__doc__.split("\n\n")[0],
    )
    index.add_argument("--model", required=True, help="text model, CLIP model, sparse, ...")
    index.add_argument("inputs", nargs="+", metavar="INPUT", help="files, folders or globs")
    index.add_argument("--out", required=True, help="output folder")
    index.add_argument(
        "--images",
        action="store_true",
        help="inputs are image folders (or, with --image-column, tables of paths / URLs)",
    )
    index.add_argument("--image-column", help="the column of image paths or URLs (tables)")
    index.add_argument("--text-column", default="text", help="the text column (default text)")
    index.add_argument("--id-column", default="id", help="the id column (default id; else row)")
    index.add_argument(
        "--keep-columns", default="", help="comma-separated columns carried into the output"
    )
    add_text_options(
        index,
        precision=None,
        per_chunk="one output row each: id, chunk, start, end, tokens, chunks, embedding",
    )
    index.add_argument(
        "--no-truncate",
        action="store_true",
        help="record over-long texts as failed instead of cutting them",
    )
    index.add_argument(
        "--task", choices=["query", "document"], help="sparse / multi-vector side (default doc)"
    )
    index.add_argument(
        "--late-chunking",
        action="store_true",
        help="pool each chunk from one pass over its whole text (a model built with it)",
    )
    index.add_argument("--shard-rows", type=int, default=10000, help="rows per shard file")
    index.add_argument("--batch-rows", type=int, help="rows per request (default: max batch)")
    index.add_argument("--concurrency", type=int, help="requests in flight (default: config)")
    index.add_argument("--restart", action="store_true", help="discard earlier output")
    index.add_argument("--qdrant", help="Qdrant URL (http://...) or local folder to upsert into")
    index.add_argument("--collection", help="Qdrant collection (default: the model name)")
    index.add_argument("--quiet", action="store_true", help="no progress, summary only")
    index.add_argument(
        "--spark",
        metavar="MASTER",
        help="run as a PySpark job on MASTER (local[4], spark://host:7077; 'submit': the "
        "master spark-submit set); inputs and --out must be paths every executor sees",
    )
    index.add_argument("--spark-tasks", type=int, help="Spark tasks (default: 2x parallelism)")


# The IndexJob fields that take their argument as it is parsed.
_JOB_ARGS = (
    "model", "out", "protocol", "admin_key", "image_column", "text_column", "id_column",
    "shard_rows", "batch_rows", "concurrency", "restart", "qdrant", "collection",
)


def job_from_args(args: argparse.Namespace, url: str) -> Any:
    """The :class:`~client.index.IndexJob` of parsed arguments."""
    from . import IndexJob  # noqa: PLC0415 - pyarrow only when indexing
    from .progress import Progress  # noqa: PLC0415 - tqdm only when indexing

    options = {
        "prompt_name": args.prompt_name,
        "dimensions": args.dimensions,
        "precision": args.precision,
        "truncate": False if args.no_truncate else None,
        "task": args.task,
        "chunk_tokens": args.chunk_tokens,
        "chunk_overlap": args.chunk_overlap,
        "late_chunking": True if args.late_chunking else None,
    }
    return IndexJob(
        inputs=list(args.inputs),
        url=url,
        timeout_s=args.timeout,
        images=args.images or bool(args.image_column),
        keep_columns=[c for c in args.keep_columns.split(",") if c],
        options={k: v for k, v in options.items() if v is not None},
        progress=Progress.auto_mode(args.quiet),
        **{name: getattr(args, name) for name in _JOB_ARGS},
    )


def run(args: argparse.Namespace, url: str) -> int:
    """Run the index command; the exit status of the module's docstring."""
    from . import (  # noqa: PLC0415 - pyarrow only when indexing
        IndexAbortedError,
        ModelKindError,
        OutputMismatchError,
        SourceError,
        run_index,
    )

    try:
        job = job_from_args(args, url)
        summary = _on_spark(job, args) if args.spark else run_index(job)
    except ImportError as exc:
        extra = "spark" if exc.name in ("pyspark", "py4j") else "index"
        print(
            f"error: {exc.name or exc}: install the '{extra}' extra "
            f"(pip install -c requirements/constraints.txt -e '.[client,index,{extra}]')",
            file=sys.stderr,
        )
        return EXIT_STOPPED
    except (
        ModelKindError,
        OutputMismatchError,
        SourceError,
        IndexAbortedError,
        EmbeddingClientError,
    ) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_STOPPED
    print(summary.line(), file=sys.stderr)
    if summary.total_errors:
        print(
            f"error: {summary.total_errors} rows failed (see {summary.out}/errors)",
            file=sys.stderr,
        )
        return EXIT_ROWS_FAILED
    return 0


def _on_spark(job: Any, args: argparse.Namespace) -> Any:
    """Run ``job`` on Spark (a session of ``--spark``; stopped after, unless spark-submit's)."""
    from .spark import index_on_spark, session  # noqa: PLC0415 - pyspark only on request

    spark = session(args.spark)
    try:
        return index_on_spark(spark, job, args.spark_tasks)
    finally:
        if args.spark != "submit":
            spark.stop()
