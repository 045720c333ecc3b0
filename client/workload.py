"""Moved to :mod:`client.load.workload`: kept for importers outside client/ and bench/.

Remove once tests/unit/test_image_preprocess.py imports :mod:`client.load.workload`.
"""

from .load.workload import _photo

__all__ = ["_photo"]
