"""The runner: one local job that ties source, mapper, worker, output folder and sinks.

    job = IndexJob(model="all-MiniLM-L6-v2", inputs=["docs/"], out="out/", url="localhost:8000")
    summary = run_index(job)          # IndexSummary: rows, errors, rate; raises on refusals

A run checks the model, then the folder's manifest: the same model (and served config),
options and input resume; anything else is refused with the difference named, unless
``restart``. Shards already on disk are skipped; shards written but not yet sent to
Qdrant (a run killed in between) are sent first.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..api import PRECISION_OUTPUTS, EmbeddingClient
from ..retry import DEFAULT_RETRY, RetryBudget
from .mapper import Mapper, ModelKindError, ModelPlan, resolve_model
from .progress import Progress
from .qdrant import QdrantSink, open_qdrant
from .sources import ImageFolderSource, SourceError, TableSource, WebDatasetSource
from .store import FORMAT_VERSION, OutputFolder, check_resumable
from .worker import ShardDone, index_partition

PART = "part"
MAX_CONCURRENCY = 32


@dataclass
class IndexJob:
    """What to index, with what, and where (see ``python -m client index --help``).

    ``url``: one server, or replicas of one deployment separated by commas (the
    requests are spread across them). ``images``: the inputs are image folders
    (``True``) or tables whose ``column`` holds image paths / URLs (``image_column``);
    else tables of texts. ``options``: the text
    model's options as ``embed`` takes them (``prompt_name``, ``dimensions``,
    ``precision``, ``truncate``, ``task``). ``concurrency`` / ``batch_rows``: requests in
    flight and rows per request (default: from the model's config).
    """

    model: str
    inputs: list[str]
    out: str
    url: str = "localhost:8000"  # several replicas: comma-separated
    protocol: str = "http"
    timeout_s: float = 120.0
    admin_key: str | None = None
    images: bool = False
    image_column: str | None = None
    text_column: str = "text"
    id_column: str = "id"
    keep_columns: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    shard_rows: int = 10000
    batch_rows: int | None = None
    concurrency: int | None = None
    restart: bool = False
    qdrant: str | None = None
    collection: str | None = None
    progress: str = "lines"
    progress_every_s: float = 10.0
    stream: TextIO | None = None


@dataclass
class IndexSummary:
    """The outcome of a run."""

    rows: int
    errors: int
    skipped: int
    total_errors: int
    seconds: float
    rows_per_s: float
    out: str
    concurrency: int
    batch_rows: int
    retries: int = 0
    resent: int = 0
    lowest_in_flight: int = 0

    def line(self) -> str:
        """The summary as one line."""
        return (
            f"indexed {self.rows} rows ({self.errors} failed) in {self.seconds:.1f} s, "
            f"{self.rows_per_s:.1f} rows/s; {self.skipped} rows already done; "
            f"{self.total_errors} failed rows in {self.out}/errors; "
            f"{self.retries} requests retried, {self.resent} batches resent after the "
            f"server refused or went away; {self.concurrency} requests in flight"
            + (
                f" (lowered to {self.lowest_in_flight} on refusals)"
                if self.lowest_in_flight < self.concurrency
                else ""
            )
        )


def make_source(job: IndexJob) -> TableSource | ImageFolderSource | WebDatasetSource:
    """The job's source: image folders or tars, tables of image paths / URLs, or texts."""
    if job.images and not job.image_column:
        if all(p.endswith(".tar") for p in job.inputs):  # files or globs of webdataset tars
            return WebDatasetSource(job.inputs, job.keep_columns)
        return ImageFolderSource(job.inputs)
    column = job.image_column or job.text_column
    return TableSource(
        job.inputs, column, job.id_column, job.keep_columns, resolve_paths=job.images
    )


def plan_sizes(plan: ModelPlan, job: IndexJob, replicas: int = 1) -> tuple[int, int]:
    """Rows per request (the model's max batch) and requests in flight.

    Two requests per instance of the ensemble's widest step, at least 4, on each of
    ``replicas`` servers: one executes while the next waits in the queue, and the round
    trips overlap.
    """
    batch = job.batch_rows or plan.max_batch
    per_server = min(MAX_CONCURRENCY, max(4, 2 * plan.instances))
    return batch, job.concurrency or per_server * replicas


def _dtype(plan: ModelPlan) -> Any:
    return PRECISION_OUTPUTS[plan.options.get("precision", "float32")][1]


def job_urls(job: IndexJob) -> list[str]:
    """The job's server addresses (``url`` split at commas)."""
    urls = [u.strip() for u in job.url.split(",") if u.strip()]
    if not urls:
        raise SourceError("no server address (--url)")
    for entry in [*job.inputs, job.out]:
        if "://" in entry:
            raise SourceError(
                f"{entry}: object-store and remote URLs are not read or written here; "
                "mount the bucket or share (a path every worker sees)"
            )
    return urls


def client_factory_for(
    job: IndexJob, urls: list[str], budget: RetryBudget, first: int = 0
) -> Callable[[], EmbeddingClient]:
    """A factory of clients, each on the next of ``urls`` in turn (from ``first``)."""
    turn = itertools.count(first)

    def factory() -> EmbeddingClient:
        return EmbeddingClient(
            urls[next(turn) % len(urls)],
            job.protocol,
            job.timeout_s,
            admin_key=job.admin_key,
            retry=DEFAULT_RETRY,
            retry_budget=budget,
            max_in_flight=1,  # the runner keeps its own count of requests in flight
        )

    return factory


def resolve_on_replicas(job: IndexJob, urls: list[str]) -> ModelPlan:
    """The model's plan, the same on every replica (else :class:`ModelKindError`)."""
    plans = []
    for url in urls:
        with EmbeddingClient(
            url, job.protocol, job.timeout_s, admin_key=job.admin_key, retry=DEFAULT_RETRY
        ) as probe:
            media = "image" if job.images else "text"
            plans.append(resolve_model(probe, job.model, media, job.options))
    for url, plan in zip(urls[1:], plans[1:], strict=True):
        if plan.config_digest != plans[0].config_digest:
            raise ModelKindError(
                f"{url} serves {plan.target} with config {plan.config_digest}, {urls[0]} with "
                f"{plans[0].config_digest}: index against replicas of one deployment"
            )
    return plans[0]


def open_output(
    job: IndexJob, plan: ModelPlan, source: Any
) -> tuple[OutputFolder, dict[str, Any], QdrantSink | None]:
    """The output folder, checked against the job (resume or refuse), its manifest and sink."""
    out = OutputFolder(Path(job.out))
    identity = {
        "format": FORMAT_VERSION,
        "model": plan.name,
        "kind": plan.kind,
        "config_digest": plan.config_digest,
        "options": plan.options,
        "input": source.fingerprint,
        "shard_rows": job.shard_rows,
    }
    check_resumable(out, identity, job.restart)
    out.root.mkdir(parents=True, exist_ok=True)
    out.prepare()
    manifest = out.read_manifest() or {**identity, "shards": {}, "qdrant": []}
    manifest.update(identity, target=plan.target, inputs=list(job.inputs))
    _record_untracked(out, manifest)
    out.write_manifest(manifest)
    return out, manifest, _sink(job, plan, out, manifest)


def run_index(job: IndexJob) -> IndexSummary:
    """Run ``job``; see the module. Raises what stops the run (clear messages)."""
    started = time.monotonic()
    urls = job_urls(job)
    source = make_source(job)
    budget = RetryBudget()
    client_factory = client_factory_for(job, urls, budget)
    plan = resolve_on_replicas(job, urls)
    batch_rows, concurrency = plan_sizes(plan, job, len(urls))
    out, manifest, sink = open_output(job, plan, source)
    progress = Progress(source.count(), job.progress, job.stream, job.progress_every_s)

    def on_shard(done: ShardDone) -> None:
        manifest["shards"][done.name] = {"rows": len(done.rows), "errors": len(done.errors)}
        if sink is not None:
            sink.upsert([r.id for r in done.rows], done.values, [r.extra for r in done.rows])
            manifest["qdrant"] = sorted({*manifest["qdrant"], done.name})
        out.write_manifest(manifest)
        progress.advance(len(done.rows) + len(done.errors), len(done.errors))

    mapper = Mapper(plan)
    try:
        result = index_rows(
            job, plan, source, out, source.rows(), mapper, client_factory,
            (batch_rows, concurrency), on_shard, progress.skip,
        )  # fmt: skip
    finally:
        progress.close()
    seconds = time.monotonic() - started
    total_errors = sum(s["errors"] for s in manifest["shards"].values())
    out.write_manifest(manifest)
    return IndexSummary(
        result.rows,
        result.errors,
        result.skipped,
        total_errors,
        seconds,
        (result.rows + result.errors) / seconds if seconds > 0 else 0.0,
        str(out.root),
        concurrency,
        batch_rows,
        budget.retries,
        mapper.server_faults,
        result.lowest_in_flight,
    )


def index_rows(
    job: IndexJob,
    plan: ModelPlan,
    source: Any,
    out: OutputFolder,
    rows: Any,
    mapper: Mapper,
    client_factory: Callable[[], EmbeddingClient],
    sizes: tuple[int, int],
    on_shard: Callable[[ShardDone], None],
    on_skip: Callable[[int], None] | None = None,
) -> Any:
    """:func:`index_partition` of ``rows`` into the job's shards.

    ``sizes``: rows per request, requests in flight. A local run and each Spark task call it.
    """
    batch_rows, concurrency = sizes
    return index_partition(
        rows,
        out,
        PART,
        mapper,
        client_factory,
        shard_rows=job.shard_rows,
        batch_rows=batch_rows,
        concurrency=concurrency,
        kept_types=source.kept_types(),
        dtype=_dtype(plan),
        on_shard=on_shard,
        on_skip=on_skip,
    )


def _record_untracked(out: OutputFolder, manifest: dict[str, Any]) -> None:
    """Shards on disk that the manifest lacks (a run killed between the two): add them."""
    import pyarrow.parquet as pq  # noqa: PLC0415 - the index extra

    for shard in sorted(out.done_shards(PART)):
        name = out.shard_name(PART, shard)
        if name not in manifest["shards"]:
            rows = pq.ParquetFile(out.embeddings / name).metadata.num_rows
            errors = pq.ParquetFile(out.errors / name).metadata.num_rows
            manifest["shards"][name] = {"rows": rows, "errors": errors}


def _sink(
    job: IndexJob, plan: ModelPlan, out: OutputFolder, manifest: dict[str, Any]
) -> QdrantSink | None:
    """The Qdrant sink, after sending the shards a killed run wrote but did not send."""
    if not job.qdrant:
        return None
    collection = job.collection or plan.name
    sink = QdrantSink(open_qdrant(job.qdrant), collection, plan.kind)
    manifest["qdrant_collection"] = collection
    send_unsent(sink, out, manifest)
    return sink


def send_unsent(sink: QdrantSink, out: OutputFolder, manifest: dict[str, Any]) -> None:
    """Upsert every finished shard the manifest does not list as sent to Qdrant."""
    import pyarrow.parquet as pq  # noqa: PLC0415 - the index extra

    sent = set(manifest.get("qdrant", []))
    for shard in sorted(out.done_shards(PART)):
        name = out.shard_name(PART, shard)
        if name not in sent:
            sink.upsert_table(pq.read_table(out.embeddings / name))
            sent.add(name)
    manifest["qdrant"] = sorted(sent)
