"""Request-path image handling: decode and preprocess, on the CPU or the GPU.

open_clip's transform is reproduced exactly (``preprocess``, ``gpu``).

``PreprocessParams`` and ``preprocess`` are named here too, for the open_clip family,
which imports them from ``embed_runtime.image``.
"""

from .preprocess import PreprocessParams, preprocess

__all__ = ["PreprocessParams", "preprocess"]
