"""What a model family hands to the repository writer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ModelDir:
    """One Triton model directory to write.

    ``adapter`` names a file in ``embed_runtime/models`` copied as ``1/model.py`` (with the
    runtime package beside it); ``files`` maps names inside ``1/`` to source files.
    """

    name: str
    config: str
    adapter: str | None
    files: dict[str, Path] = field(default_factory=dict)
