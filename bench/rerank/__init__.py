"""The rerank load, ``python -m bench.rerank`` (part of ``make bench``).

The runner and its section of ``docs/benchmarks.md``.
"""
