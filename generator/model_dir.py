"""What a model family hands to the repository writer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from embed_runtime.steps import Adapter, adapter


@dataclass(frozen=True)
class ModelDir:
    """One Triton model directory to write.

    ``adapter`` (an :class:`~embed_runtime.steps.Adapter`; None for the native backend and
    ensembles) is copied as ``1/model.py`` with the runtime package beside it; a name no
    adapter has fails here, naming the known ones. ``files`` maps names inside ``1/`` to
    source files.
    """

    name: str
    config: str
    adapter: Adapter | None
    files: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.adapter is not None:
            object.__setattr__(self, "adapter", adapter(self.adapter))
