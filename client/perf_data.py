"""Moved to :mod:`client.load.perf_data`: kept for importers outside client/ and bench/.

Remove once deploy/perf/perf_plan.py imports :mod:`client.load.perf_data`.
"""

from .load.perf_data import write_perf_data

__all__ = ["write_perf_data"]
