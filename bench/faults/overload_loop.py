"""The loads of ``bench.faults.overload``, the open loop that sends them, and its figures."""

from __future__ import annotations

import io
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from bench.manifest import TEXT_MODEL
from embed_runtime.serving.admission import DEADLINE_PARAMETER

OUTPUT = "EMBEDDING"
LOADS = ("text1", "text32", "images")
TEXT_ROWS = 32
# A closed loop of 32-row requests saturates the server with a quarter of the clients
# (``make bench``'s 4 x 32); 32 such clients only queue, and each request takes seconds.
MULTI_ROW_CLIENT_SHARE = 4
# scikit-image's bundled photographs (no download); ``camera`` is greyscale.
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field",
          "immunohistochemistry", "retina", "camera")
JPEG_QUALITY = 90
DRAIN_S = 5.0
ATOL = 1e-5
REFUSALS = ("StatusCode.UNAVAILABLE", "StatusCode.RESOURCE_EXHAUSTED")
DEADLINE = "StatusCode.DEADLINE_EXCEEDED"
ANSWERED = ("accepted", "refused", "past_deadline", "other_error")
GOAL_GOODPUT_RATIO = 0.9
GOAL_P99_RATIO = 2.0
GOAL_REFUSAL_MS = 50.0
TABLE_HEADER = ("config", "load", "x", "req/s", "goodput", "p50 ms", "p50 x", "p99 ms",
                "p99 x", "refusal p99", "refused", "late", "lg cpu", "goal")


@dataclass
class Shot:
    """One open-loop request: which request, when planned, sent and answered, and how."""

    item: int
    planned: float
    sent: float = 0.0
    done: float = 0.0
    status: str = ""
    vector: np.ndarray | None = None


def grpc_input(name: str, rows: Sequence[bytes]) -> Any:
    """A gRPC ``InferInput`` named ``name`` of shape ``[len(rows), 1]`` (BYTES)."""
    import tritonclient.grpc as grpcclient

    item = grpcclient.InferInput(name, [len(rows), 1], "BYTES")
    item.set_data_from_numpy(np.array([[r] for r in rows], dtype=object))
    return item


@dataclass
class Load:
    """One load: its model and input, its requests; ``rows[k]``: request k's rows of ``pool``."""

    name: str
    model: str
    input_name: str
    source: str
    requests: list[list[bytes]]
    rows: list[list[int]]
    pool: list[bytes]  # the rows of ``source``, each sent alone for its reference
    inputs: list[Any] = field(default_factory=list, repr=False)  # gRPC, built once

    @property
    def base(self) -> str:
        """The served model whose steps this load reaches (``all-MiniLM-L6-v2``, ``clip-tiny``)."""
        return self.model.removesuffix("_image")

    def closed_loop_clients(self, clients: Sequence[int]) -> list[int]:
        """The concurrencies to measure this load's sustainable rate at (fewer for many rows)."""
        if len(self.requests[0]) == 1:
            return list(clients)
        return sorted({max(1, c // MULTI_ROW_CLIENT_SHARE) for c in clients})


def photos(names: Sequence[str] = PHOTOS) -> dict[str, bytes]:
    """Each photo of ``names`` as RGB JPEG bytes (name -> bytes)."""
    try:
        from skimage import data
    except ImportError as exc:
        raise SystemExit(
            "the images load needs scikit-image (pip install scikit-image), "
            "or leave it out: --load text1,text32"
        ) from exc
    from PIL import Image

    out = {}
    for name in names:
        buf = io.BytesIO()
        image = Image.fromarray(getattr(data, name)()).convert("RGB")
        image.save(buf, format="JPEG", quality=JPEG_QUALITY)
        out[name] = buf.getvalue()
    return out


def make_loads(
    names: Sequence[str], sentences: Sequence[str], clip: str, images: Sequence[bytes] = ()
) -> list[Load]:
    """The loads ``names``: ``text1`` (a sentence a request), ``text32``, ``images`` (a photo)."""
    encoded = [s.encode() for s in sentences]
    count = len(encoded)
    groups = [  # 32 consecutive sentences a request, the pool covered uniformly
        [(k * TEXT_ROWS + j) % count for j in range(TEXT_ROWS)]
        for k in range(max(count // TEXT_ROWS, 1))
    ]
    built = {
        "text1": Load("text1", TEXT_MODEL, "TEXT", "text", [[t] for t in encoded],
                      [[i] for i in range(count)], encoded),
        "text32": Load("text32", TEXT_MODEL, "TEXT", "text",
                       [[encoded[i] for i in g] for g in groups], groups, encoded),
        "images": Load("images", f"{clip}_image", "IMAGE", "images", [[b] for b in images],
                       [[i] for i in range(len(images))], list(images)),
    }
    return [built[name] for name in names]


def expected_rows(matrix: np.ndarray, rows: Sequence[Sequence[int]], item: int) -> np.ndarray:
    """The reference rows of request ``item``: ``matrix[rows[item]]``."""
    return matrix[list(rows[item])]


def references(url: str, loads: Sequence[Load]) -> dict[str, np.ndarray]:
    """The reference matrix of every source the loads use: each row of its pool sent alone."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    out = {}
    try:
        for source, load in {load.source: load for load in loads}.items():
            answers = [
                client.infer(load.model, [grpc_input(load.input_name, [row])], client_timeout=120.0)
                for row in load.pool
            ]
            out[source] = np.stack([answer.as_numpy(OUTPUT)[0] for answer in answers])
    finally:
        client.close()
    return out


def plan(rate: float, seconds: float, requests: int, seed: int, start: float) -> list[Shot]:
    """Poisson arrivals at ``rate``/s for ``seconds`` from ``start``, each a random request."""
    rng = np.random.default_rng(seed)
    count = max(int(rate * seconds), 1)
    gaps = rng.exponential(1.0 / rate, count)
    picks = rng.integers(0, requests, count)
    times = start + np.cumsum(gaps) - gaps[0]
    return [Shot(int(i), float(t)) for i, t in zip(picks, times, strict=True)]


def deadline_parameters(deadline_s: float, wall: Callable[[], float] = time.time) -> dict[str, int]:
    """The request parameter that carries the client deadline: absolute, µs since the epoch."""
    return {DEADLINE_PARAMETER: int((wall() + deadline_s) * 1e6)}


def open_loop(
    url: str,
    load: Load,
    rate: float,
    seconds: float,
    deadline_s: float,
    senders: int,
    seed: int,
    send_deadline: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[Shot], float]:
    """Poisson arrivals of ``load`` at ``rate``/s for ``seconds``, sent by ``senders`` threads.

    Each request carries the deadline as ``client_timeout`` (and, with ``send_deadline``, as
    the request parameter). Returns the shots and the seconds from the first arrival to the
    last send.
    """
    import tritonclient.grpc as grpcclient

    if not load.inputs:
        load.inputs = [grpc_input(load.input_name, request) for request in load.requests]
    shots = plan(rate, seconds, len(load.inputs), seed, clock() + 0.2)
    clients = [grpcclient.InferenceServerClient(url) for _ in range(senders)]

    def answered(shot: Shot, result: Any, error: Any) -> None:  # on a gRPC thread
        shot.status = "" if error is None else f"{error.status()}: {error.message()}"
        shot.vector = None if result is None else result.as_numpy(OUTPUT)
        shot.done = clock()

    def send(index: int) -> None:
        client = clients[index]
        for shot in shots[index::senders]:
            wait = shot.planned - clock()
            if wait > 0:
                time.sleep(wait)
            shot.sent = clock()
            client.async_infer(
                load.model,
                [load.inputs[shot.item]],
                partial(answered, shot),
                client_timeout=deadline_s,
                parameters=deadline_parameters(deadline_s) if send_deadline else None,
            )

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sent_s = max(s.sent for s in shots) - shots[0].planned
    limit = clock() + deadline_s + DRAIN_S
    while any(not s.done for s in shots) and clock() < limit:
        time.sleep(0.05)
    for client in clients:
        client.close()
    return shots, sent_s


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50 / p99 / max of ``values`` (ms), rounded; empty -> ``{}``."""
    if not len(values):
        return {}
    a = np.asarray(values, dtype=np.float64)
    found = {"p50": np.percentile(a, 50), "p99": np.percentile(a, 99), "max": a.max()}
    return {k: round(float(v), 2) for k, v in found.items()}


def status_key(status: str) -> str:
    """A status with its free-standing numbers masked, so alike messages count together."""
    return re.sub(r"(?<![\w.-])\d+(\.\d+)?", "#", status)[:120]


def classify(shot: Shot, deadline_s: float) -> str:
    """``accepted``, ``refused``, ``past_deadline``, ``other_error`` or ``no_answer``.

    Refused: gRPC ``UNAVAILABLE`` / ``RESOURCE_EXHAUSTED`` in time; past the deadline:
    ``DEADLINE_EXCEEDED``, or any answer (a refusal too) after ``deadline_s``.
    """
    if not shot.done:
        return "no_answer"
    if shot.status.startswith(DEADLINE) or shot.done - shot.sent > deadline_s:
        return "past_deadline"
    if shot.status:
        return "refused" if shot.status.startswith(REFUSALS) else "other_error"
    return "accepted"


def outcome(
    shots: Sequence[Shot],
    expected: Callable[[int], np.ndarray],
    deadline_s: float,
    target_rate: float,
    sent_s: float,
) -> dict[str, Any]:
    """Counts, latencies (ms), goodput and correctness of one open-loop run.

    Goodput: right answers in time per second, from the first planned arrival to the last
    of them; ``expected(item)``: request ``item``'s reference rows.
    """
    kinds: dict[str, list[float]] = {k: [] for k in ANSWERED}
    statuses: Counter[str] = Counter()
    wrong, worst, good_until = 0, 0.0, []
    for shot in shots:
        kind = classify(shot, deadline_s)
        statuses[status_key(shot.status) if shot.status else kind] += 1
        if kind == "no_answer":
            continue
        kinds[kind].append((shot.done - shot.sent) * 1000.0)
        if kind == "accepted":  # the max abs difference from the reference rows
            want, got = expected(shot.item), shot.vector
            same = got is not None and got.shape == want.shape
            diff = float(np.abs(got - want).max()) if same else float("inf")
            worst = max(worst, diff)
            if diff > ATOL:
                wrong += 1
            else:
                good_until.append(shot.done)
    start = min((s.planned for s in shots), default=0.0)
    span = max(good_until, default=start) - start
    return {
        "target_rate": round(target_rate, 2),
        "send_rate": round(len(shots) / sent_s, 2) if sent_s > 0 else 0.0,
        "send_lag_ms": percentiles([(s.sent - s.planned) * 1000.0 for s in shots if s.sent]),
        "sent": len(shots),
        "accepted": len(kinds["accepted"]),
        "good": len(good_until),
        "refused": len(kinds["refused"]),
        "past_deadline": len(kinds["past_deadline"]),
        "other_errors": len(kinds["other_error"]),
        "no_answer": statuses["no_answer"],
        "goodput": round(len(good_until) / span, 2) if span > 0 else 0.0,
        "statuses": dict(statuses.most_common()),
        "accepted_ms": percentiles(kinds["accepted"]),
        "refused_ms": percentiles(kinds["refused"]),
        "past_deadline_ms": percentiles(kinds["past_deadline"]),
        "wrong": wrong,
        "max_abs_diff": worst,
    }


def _ratio(value: float | None, base: float | None) -> float | None:
    return round(value / base, 2) if value is not None and base else None


def judge(run: dict[str, Any], sustainable: float, reference_ms: Mapping[str, float]) -> None:
    """Add the ratios to ``reference_ms`` (the 0.8 x run's) and the goal, part by part."""
    acc, refused = run["accepted_ms"], run["refused_ms"]
    run["goodput_ratio"] = _ratio(run["goodput"], sustainable) or 0.0
    run["accepted_p50_ratio"] = _ratio(acc.get("p50"), reference_ms.get("p50"))
    run["accepted_p99_ratio"] = _ratio(acc.get("p99"), reference_ms.get("p99"))
    p99 = run["accepted_p99_ratio"]
    goal = {
        "goodput": run["goodput_ratio"] >= GOAL_GOODPUT_RATIO,
        "accepted_p99": p99 is not None and p99 <= GOAL_P99_RATIO,
        "refusal_p99": not refused or refused["p99"] <= GOAL_REFUSAL_MS,
        "deadline": run["past_deadline"] + run["no_answer"] == 0,
        "vectors": run["wrong"] == 0 and run["other_errors"] == 0,
    }
    run["goal"] = {**goal, "met": all(goal.values())}


def cpu_share(busy_s: float, seconds: float, cores: int) -> float:
    """Busy core-seconds as a share of ``cores`` over ``seconds`` (0..1)."""
    return round(busy_s / (seconds * cores), 3) if seconds > 0 and cores > 0 else 0.0


def table_row(record: Mapping[str, Any]) -> tuple[str, ...]:
    """One row of the final table for a (configuration, load, factor) record."""
    acc, goal = record["accepted_ms"], record["goal"]
    missed = [k for k, ok in goal.items() if k != "met" and not ok]
    return (
        record["config"],
        record["load"],
        f"{record['factor']:g}",
        f"{record['target_rate']:.1f}",
        f"{record['goodput_ratio']:.2f}",
        f"{acc.get('p50', '-')}",
        f"{record['accepted_p50_ratio']}",
        f"{acc.get('p99', '-')}",
        f"{record['accepted_p99_ratio']}",
        f"{record['refused_ms'].get('p99', '-')}",
        str(record["refused"]),
        str(record["past_deadline"] + record["no_answer"]),
        f"{record['load_generator_cpu_share']:.0%}",
        "met" if goal["met"] else "missed " + ",".join(missed),
    )


def table(records: Sequence[Mapping[str, Any]]) -> str:
    """The compact table: one aligned row per (configuration, load, factor)."""
    rows = [TABLE_HEADER, *(table_row(r) for r in records)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_HEADER))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def describe(run: dict[str, Any]) -> str:
    """A few lines per (configuration, load, factor)."""
    lines = [
        f"== {run['config']} {run['load']} at {run['factor']:g} x "
        f"({run['target_rate']} req/s of sustainable {run['sustainable']}):",
        f"   sent {run['sent']} at {run['send_rate']}/s (lag p99 "
        f"{run['send_lag_ms'].get('p99')} ms); accepted {run['accepted']}, good {run['good']} "
        f"({run['goodput']}/s = {run['goodput_ratio']} x), refused {run['refused']}, past "
        f"deadline {run['past_deadline']}, other errors {run['other_errors']}, no answer "
        f"{run['no_answer']}",
        f"   accepted ms {run['accepted_ms']} = p50 {run['accepted_p50_ratio']} x, p99 "
        f"{run['accepted_p99_ratio']} x the 0.8 x run; refused ms {run['refused_ms']}; wrong "
        f"{run['wrong']} (max abs diff {run['max_abs_diff']:.1e})",
    ]
    lines += [f"   status {count:6d}  {status}" for status, count in run["statuses"].items()]
    lines += [
        f"   server {s['name']}: {s['success_count']} ok, {s['fail_count']} failed, "
        f"{s['inference_count'] / max(s['execution_count'], 1):.1f} rows/exec, queue "
        f"{s['avg_queue_ms']:.1f} ms, infer {s['avg_compute_infer_ms']:.1f} ms"
        for s in run["server"]
        if "encode" in s["name"]
    ]
    lines += [
        f"   server {s['name']}: {s['fail_count']} failed after {s['avg_fail_ms']:.1f} ms "
        "on average (receipt to refusal, inside the server)"
        for s in run["server"]
        if s["fail_count"] and s["name"] == run["model"]
    ]
    lines.append(
        f"   cpu s {run['cpu_s']} (load generator {run['load_generator_cpu_share']:.0%}"
        f" of the machine); served after the loop {run['served_after']} requests "
        f"over {run['served_after_s']} s"
    )
    lines.append(f"   goal: {run['goal']}")
    return "\n".join(lines)
