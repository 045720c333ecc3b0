"""Load generation for benchmarks: workloads, the closed-loop load generator, perf data.

Not part of the thin client: :mod:`client.cli` imports it only for ``bench`` and
``perf-data``, and the benchmark suite (``bench/``) builds on it.
"""
