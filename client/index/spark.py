"""The indexer as a PySpark job: the corpus's shards spread over Spark tasks and replicas.

    from pyspark.sql import SparkSession
    from client.index import IndexJob
    from client.index.spark import index_on_spark

    spark = SparkSession.builder.getOrCreate()
    job = IndexJob(model="all-MiniLM-L6-v2", inputs=["/mnt/corpus/"], out="/mnt/out/",
                   url="triton-a:8000,triton-b:8000")
    summary = index_on_spark(spark, job)

The driver does what a local run does first (the model, the same on every replica; the
output folder's manifest: resume or refuse; Qdrant leftovers), then splits the shards
not yet on disk into runs of consecutive shards, one Spark task each
(``mapPartitionsWithIndex``). A task reads only its rows (files wholly before its slice
are counted, not read), embeds them with :func:`~client.index.worker.index_partition`
against the replicas (task ``i`` starts at replica ``i``; its threads take the replicas
in turn) and writes its shards into the shared output folder under the names a local
run gives them. So the output is the local run's, file for file, and a failed task, a
killed job or a local run over the same folder resumes where the other stopped: a
retried task skips the shards its earlier attempt finished.

The inputs and the output folder must be paths every executor sees (a shared mount:
NFS / EFS, a ReadWriteMany volume, ``/dbfs`` on Databricks). The executors need this
package with its ``client`` and ``index`` extras, and reach the servers themselves.
Qdrant upserts run on the driver once the shards are written (idempotent: ids are stable),
and the admin key (the model's config is read on the driver) is not sent to the tasks.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..retry import RetryBudget
from .mapper import IndexAbortedError, Mapper, ModelPlan
from .runner import (
    PART,
    IndexJob,
    IndexSummary,
    _record_untracked,
    client_factory_for,
    index_rows,
    job_urls,
    make_source,
    open_output,
    plan_sizes,
    resolve_on_replicas,
    send_unsent,
)
from .store import OutputFolder
from .worker import ShardDone

# Spark settings of a session this module makes itself (``session``): loopback only, no UI.
LOCAL_SETTINGS = {
    "spark.ui.enabled": "false",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.ui.showConsoleProgress": "false",
}


def session(master: str, app: str = "embed-index") -> Any:
    """A SparkSession on ``master``: a master URL (``local[4]``, ``spark://h:7077``).

    ``submit`` takes the master ``spark-submit`` configured. A local master runs its
    Python workers on this interpreter, listens on loopback only and has no web UI.
    """
    from pyspark.sql import SparkSession  # noqa: PLC0415 - the spark extra

    builder = SparkSession.builder.appName(app)
    if master != "submit":
        builder = builder.master(master)
    if master.startswith("local"):
        # PySpark's driver starts its workers with $PYSPARK_PYTHON (else python3 on PATH)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        for key, value in LOCAL_SETTINGS.items():
            builder = builder.config(key, value)
    return builder.getOrCreate()


def shard_slices(pending: list[int], tasks: int) -> list[tuple[int, int]]:
    """``pending`` shard numbers (sorted) cut into at most ``tasks`` runs ``[first, stop)``.

    Runs hold about the same number of pending shards; a run may span finished shards
    between its pending ones (the task skips those).
    """
    if not pending:
        return []
    size = math.ceil(len(pending) / max(1, tasks))
    return [(chunk[0], chunk[-1] + 1) for chunk in _chunks(pending, size)]


def _chunks(items: list[int], size: int) -> list[list[int]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _task(
    job: IndexJob, plan: ModelPlan, urls: list[str], batch_rows: int, concurrency: int
) -> Any:
    """The function each Spark task runs on its slices (picklable: no Spark objects).

    The admin key stays on the driver: tasks only send inference requests.
    """
    job = dataclasses.replace(job, admin_key=None, stream=None)

    def run(task: int, slices: Any) -> Any:
        source = make_source(job)
        out = OutputFolder(Path(job.out))
        for first, stop in slices:
            yield _index_slice(
                job, plan, urls, source, out, task, (first, stop), batch_rows, concurrency
            )

    return run


def _index_slice(
    job: IndexJob,
    plan: ModelPlan,
    urls: list[str],
    source: Any,
    out: OutputFolder,
    task: int,
    shards: tuple[int, int],
    batch_rows: int,
    concurrency: int,
) -> dict[str, Any]:
    """Index the shards ``[first, stop)`` of ``shards``; a report for the driver."""
    budget = RetryBudget()
    mapper = Mapper(plan)
    written: dict[str, dict[str, int]] = {}

    def on_shard(done: ShardDone) -> None:
        written[done.name] = {"rows": len(done.rows), "errors": len(done.errors)}

    first, stop = shards
    rows = source.rows(first * job.shard_rows, stop * job.shard_rows)
    factory = client_factory_for(job, urls, budget, first=task)
    result = index_rows(
        job, plan, source, out, rows, mapper, factory, (batch_rows, concurrency), on_shard
    )
    return {
        "task": task,
        "shards": written,
        "rows": result.rows,
        "errors": result.errors,
        "retries": budget.retries,
        "resent": mapper.server_faults,
        "lowest_in_flight": result.lowest_in_flight,
    }


def index_on_spark(spark: Any, job: IndexJob, tasks: int | None = None) -> IndexSummary:
    """Run ``job`` as a Spark job on ``spark`` (a SparkSession); see the module.

    ``tasks``: how many Spark tasks share the pending shards (default: twice the
    cluster's default parallelism, at most one per shard). Requests in flight
    (``job.concurrency``, default from the model's config on every replica) are shared
    by the tasks that run at once. Raises :class:`IndexAbortedError` when the Spark job
    fails (the shards written stay; run again to resume).
    """
    started = time.monotonic()
    urls = job_urls(job)
    source = make_source(job)
    plan = resolve_on_replicas(job, urls)
    batch_rows, concurrency = plan_sizes(plan, job, len(urls))
    out, manifest, sink = open_output(job, plan, source)
    total = source.count()
    done = out.done_shards(PART)
    pending = [s for s in range(math.ceil(total / job.shard_rows)) if s not in done]
    context = spark.sparkContext
    parallel = max(1, int(context.defaultParallelism))
    slices = shard_slices(pending, tasks or 2 * parallel)
    at_once = min(parallel, max(1, len(slices)))
    per_task = max(2, math.ceil(concurrency / at_once))
    reports: list[dict[str, Any]] = []
    if slices:
        rdd = context.parallelize(slices, len(slices))
        try:
            reports = rdd.mapPartitionsWithIndex(
                _task(job, plan, urls, batch_rows, per_task)
            ).collect()
        except Exception as exc:  # Py4J wraps what the task raised
            _record_untracked(out, manifest)
            out.write_manifest(manifest)
            raise IndexAbortedError(
                f"the Spark job failed ({_last_line(exc)}); the shards written stay in "
                f"{out.root}: run the same job again to resume"
            ) from exc
    for report in reports:
        manifest["shards"].update(report["shards"])
    _record_untracked(out, manifest)
    if sink is not None:
        send_unsent(sink, out, manifest)
    out.write_manifest(manifest)
    seconds = time.monotonic() - started
    rows = sum(r["rows"] for r in reports)
    errors = sum(r["errors"] for r in reports)
    return IndexSummary(
        rows,
        errors,
        total - rows - errors,
        sum(s["errors"] for s in manifest["shards"].values()),
        seconds,
        (rows + errors) / seconds if seconds > 0 else 0.0,
        str(out.root),
        per_task * at_once,
        batch_rows,
        sum(r["retries"] for r in reports),
        sum(r["resent"] for r in reports),
        min((r["lowest_in_flight"] for r in reports), default=per_task) * at_once,
    )


def _last_line(exc: BaseException) -> str:
    """The useful line of a Py4J error: the Python exception the task raised."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    found = [line for line in lines if "Error:" in line and not line.startswith("at ")]
    return (found[-1] if found else (lines[0] if lines else type(exc).__name__))[:300]
