"""The benchmark suite: ``python -m bench.run`` (``make bench``); see docs/benchmarks.md."""
