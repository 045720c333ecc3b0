"""Where ``generator/families/open_clip`` still imports ``TokenizerParams`` from.

The tokenizers live in ``embed_runtime.text.tokenizer``; this name stays until the
open_clip family imports from there.
"""

from .text.tokenizer import TokenizerParams

__all__ = ["TokenizerParams"]
