"""Index a corpus through the server: ``python -m client index`` and its Python API.

Parts, as clip-retrieval splits a corpus job: :mod:`.sources` (readers: tables, image
folders), :mod:`.mapper` (the model's plan; batches to vectors, bad rows isolated),
:mod:`.worker` (one partition: rows in, shard files and error rows out, resumable),
:mod:`.store` (the output folder, atomic writes, the manifest), :mod:`.qdrant` (a sink),
:mod:`.runner` (a local job). See docs/indexing.md.
"""

from .mapper import IndexAbortedError, ModelKindError, ModelPlan, resolve_model
from .runner import IndexJob, IndexSummary, run_index
from .sources import ImageFolderSource, Row, SourceError, TableSource, WebDatasetSource
from .store import OutputFolder, OutputMismatchError
from .worker import index_partition

__all__ = [
    "ImageFolderSource",
    "IndexAbortedError",
    "IndexJob",
    "IndexSummary",
    "ModelKindError",
    "ModelPlan",
    "OutputFolder",
    "OutputMismatchError",
    "Row",
    "SourceError",
    "TableSource",
    "WebDatasetSource",
    "index_partition",
    "resolve_model",
    "run_index",
]
