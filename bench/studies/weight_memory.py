"""Memory of one encoder instance's two sessions, with and without the weight cache.

    python -m bench.studies.weight_memory [GRAPH ...]

For each graph (default: the bench repository's MiniLM encoder and ViT-B-32 image tower,
built by ``make bench``), a fresh process builds an :class:`OrtEncoder` as a CPU encoder
instance with ``ort_threads_shared`` builds it (the alone session and the shared one),
runs one input through each, and reports its resident memory and its anonymous (private,
unshared) memory growth: once with ``weight_cache=false`` (each session packs its own
weights) and once with the cache (both map one file, shared with every other instance
through the page cache; the copy is written before, so this is what every instance pays
when it loads it). Prints one line per graph and setting.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.manifest import ROOT
from embed_runtime.ops.weight_cache import cached_model

DEFAULT_GRAPHS = (
    ROOT / ".build" / "bench-repo" / "all-MiniLM-L6-v2_encode" / "1" / "model.onnx",
    ROOT / ".build" / "bench-repo" / "clip-vit-b-32_encode_image" / "1" / "model.onnx",
)

CHILD = r"""
import sys
import numpy as np
import onnx
from embed_runtime.engines.ort_encoder import EncoderParams, OrtEncoder

path, cache = sys.argv[1], sys.argv[2]

def memory():
    fields = dict(line.split(":", 1) for line in open("/proc/self/smaps_rollup") if ":" in line)
    return (int(fields[k].split()[0]) / 1024 for k in ("Rss", "Anonymous"))

class Board:  # stands in for the instances' busy board: this instance is never busy-shared
    def running(self):
        raise AssertionError("not used without a run through encode_*")

graph = onnx.load(path, load_external_data=False).graph
names = [i.name for i in graph.input if i.name not in {t.name for t in graph.initializer}]
del graph
params = EncoderParams.from_parameters({
    "onnx_file": "model.onnx", "input_names": ",".join(names), "output_name": "EMBEDDING",
    "ragged": "false", "max_rows_per_run": "8", "shared_intra_op_threads": "1",
    "weight_cache": cache,
})
rss0, anon0 = memory()
encoder = OrtEncoder(path, params, 0, Board())
if "pixel_values" in names:
    feed = {"pixel_values": np.zeros((1, 3, 224, 224), np.float32)}
else:
    feed = {n: np.full((1, 12), n != "token_type_ids", np.int64) for n in names}
for session in (encoder.session, encoder.shared_session):
    session.run(None, feed)
rss1, anon1 = memory()
print(f"{rss1 - rss0:.0f} {anon1 - anon0:.0f}")
"""


def main(argv: list[str] | None = None) -> int:
    """Print the figures; returns 0."""
    graphs = [Path(a) for a in (argv if argv is not None else sys.argv[1:])] or DEFAULT_GRAPHS
    print(f"{'graph':60s} {'cache':6s} {'RSS MiB':>8s} {'private MiB':>11s}")
    for graph in graphs:
        cached_model(str(graph))  # written beforehand: the child measures a load, not a write
        for cache in ("false", "true"):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(graph), cache],
                capture_output=True,
                text=True,
                check=True,
                cwd=ROOT,
            ).stdout.split()
            name = str(graph.relative_to(ROOT)) if graph.is_relative_to(ROOT) else str(graph)
            print(f"{name:60s} {cache:6s} {out[0]:>8s} {out[1]:>11s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
