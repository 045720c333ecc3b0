"""docs/benchmarks.md, written in full by bench.page from the newest run file of each kind."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench import page
from tests.unit.bench.gpu.test_gpu import TEXT
from tests.unit.bench.rerank.test_report import _rerank_results
from tests.unit.bench.test_report import _results

ROOT = Path(__file__).resolve().parents[3]


def _write(folder: Path, name: str, data: dict) -> Path:
    path = folder / name
    path.write_text(json.dumps(data))
    return path


def test_the_newest_run_file_of_each_kind_is_read_by_its_stamp_not_its_time(tmp_path) -> None:
    """An older run written later (a clone gives every file the same time) is not taken, and
    a longer prefix with the same start (cpu-full-set-...) is another kind."""
    old, new = _results(), _results()
    new["meta"]["started"] = "2026-12-01T00:00:00Z"
    _write(tmp_path, "cpu-full-2026-12-01T000000Z.json", new)
    later = _write(tmp_path, "cpu-full-2026-11-01T000000Z.json", old)
    os.utime(later, (2e9, 2e9))
    _write(tmp_path, "cpu-full-set-2026-12-31T000000Z.json", old)
    source, data = page.newest("cpu-full", tmp_path)
    assert Path(source).name == "cpu-full-2026-12-01T000000Z.json"
    assert data["meta"]["started"] == "2026-12-01T00:00:00Z"
    assert page.newest("gateway", tmp_path) is None


def test_the_page_names_every_target_and_the_run_file_of_every_section(tmp_path) -> None:
    monkey_root = tmp_path
    _write(monkey_root, "cpu-full-2026-12-01T000000Z.json", _results())
    _write(monkey_root, "rerank-cpu-full-2026-12-01T000000Z.json", _rerank_results())
    _write(monkey_root, "gpu-all-2026-12-01T000000Z.json", TEXT)
    perf = "<!-- perf:begin -->\n\n## perf_analyzer sweep\n\n| c | 1 |\n\n<!-- perf:end -->"
    text = page.build(f"# old page\n\nhand-written, gone\n\n{perf}\n", monkey_root)
    assert "hand-written, gone" not in text
    assert text.count(perf) == 1 and text.index(perf) < text.index("## Method")
    assert "| text | served >= 0.9 x the load's ceiling (16 x 1) | 0.72 x | **no** |" in text
    for section in ("Text and images", "Rerank", "GPU"):
        head = next(line for line in text.splitlines() if line.startswith(f"## {section}"))
        after = text[text.index(head):].splitlines()[2]
        assert after.startswith("From `bench/results/") and "2026-12-01" in after, after


def test_the_committed_page_is_the_one_the_run_files_give_and_is_short() -> None:
    """No hand edit survives: the page in the repository is what bench.page writes from the
    committed run files (rerun `python -m bench.page` after adding one), under 400 lines."""
    committed = (ROOT / "docs" / "benchmarks.md").read_text()
    assert page.build(committed) == committed
    assert committed.count("\n") < 400
