"""Moved to :mod:`client.load.corpus`: kept for importers outside client/ and bench/.

Remove once tests/ and deploy/ import :mod:`client.load.corpus`.
"""

from .load.corpus import LONG_TEXTS, SENTENCES, varied_sentences

__all__ = ["LONG_TEXTS", "SENTENCES", "varied_sentences"]
