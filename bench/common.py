"""The helpers every benchmark shares: progress logs, medians, Markdown tables, templates.

Prose lives in ``bench/templates/*.md`` (Jinja, strict); Python computes the values.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, TextIO

TEMPLATES = Path(__file__).with_name("templates")
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def save_results(results: dict[str, Any], prefix: str, quick: bool = False) -> str:
    """:func:`write_results` as ``<prefix>-<results["started"], compact>``; path from root."""
    stamp = results["started"].replace(":", "").replace("-", "")
    return str(write_results(results, f"{prefix}-{stamp}", quick).relative_to(ROOT))


def write_results(results: dict[str, Any], name: str, quick: bool = False) -> Path:
    """Write ``bench/results/<name>.json`` (``.build/bench-results/`` for a quick run).

    Its path from the root goes into ``results["meta"]["results_file"]``, if any meta.
    """
    out = (ROOT / ".build" / "bench-results" if quick else RESULTS) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if "meta" in results:
        results["meta"]["results_file"] = str(out.relative_to(ROOT))
    out.write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")
    return out


def logger(tag: str, stream: TextIO | None = None) -> Callable[[str], None]:
    """A ``log(message)`` printing ``[<tag> HH:MM:SS] message`` (stderr unless ``stream``)."""

    def log(message: str) -> None:
        print(
            f"[{tag} {time.strftime('%H:%M:%S')}] {message}",
            file=stream or sys.stderr,
            flush=True,
        )

    return log


def run_threads(threads: Sequence[threading.Thread]) -> float:
    """Start ``threads`` and wait for them all; the seconds that took."""
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def median(values: Iterable[float]) -> float:
    """Median, or NaN for no values."""
    values = list(values)
    return statistics.median(values) if values else float("nan")


def table(header: Sequence[str], rows: Iterable[Sequence[str | None]]) -> str:
    """A Markdown table; a ``None`` cell is written ``| |`` (an empty string ``|  |``)."""

    def line(cells: Sequence[str | None]) -> str:
        return "|" + "|".join(" " if cell is None else f" {cell} " for cell in cells) + "|"

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(row) for row in rows)])


@cache
def _environment():
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render_template(name: str, **values: Any) -> str:
    """``bench/templates/<name>`` rendered with ``values``."""
    return _environment().get_template(name).render(**values)
