"""The faults benchmarks of ``make bench``: overload and the memory soak.

``python -m bench.faults.overload`` and ``python -m bench.faults.soak``.
"""
