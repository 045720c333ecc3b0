"""Where ``generator/families/open_clip`` still imports ``require_cuda_device`` from.

The GPU image decoder lives in ``embed_runtime.image.gpu``; this name stays until the
open_clip family imports from there.
"""

from .image.gpu import require_cuda_device

__all__ = ["require_cuda_device"]
