"""Upserts of finished shards into a Qdrant collection (``--qdrant URL_OR_PATH``).

Point ids are ``uuid5`` of the row id (of ``"<row id>#<chunk>"`` for chunks), so a
resumed or repeated run writes the same points again (idempotent); the payload holds the
row id and the kept columns, and for chunks the chunk's index, start and end. Vectors
are stored as the LangChain classes store them: dense and multi-vector (MaxSim) as the
unnamed vector, sparse as the named vector ``langchain-sparse``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

# A fixed namespace: the same row id gives the same point id in every run and collection.
POINT_NAMESPACE = uuid.UUID("6f1d1c2e-5b8a-4c47-9e51-2a4b3f0d7c11")
SPARSE_VECTOR_NAME = "langchain-sparse"


def point_id(row_id: str) -> str:
    """The Qdrant point id of a row: uuid5 of its id."""
    return str(uuid.uuid5(POINT_NAMESPACE, row_id))


def open_qdrant(target: str) -> Any:
    """A ``QdrantClient`` for a server URL (http[s]://...) or a local folder (local mode)."""
    from qdrant_client import QdrantClient  # noqa: PLC0415 - optional dependency

    if target.startswith(("http://", "https://")):
        return QdrantClient(url=target)
    if target == ":memory:":
        return QdrantClient(":memory:")
    return QdrantClient(path=target)


def chunk_points(
    ids: Sequence[str], values: Sequence[Any], payloads: Sequence[dict]
) -> tuple[list[str], list[Any], list[dict]]:
    """Each row's chunks as points: the row's id, the chunk's vector, its index and span."""
    out_ids, out_values, out_payloads = [], [], []
    for row_id, chunks, payload in zip(ids, values, payloads, strict=True):
        for n, chunk in enumerate(chunks):
            out_ids.append(row_id)
            out_values.append(chunk.vector)
            out_payloads.append({**payload, "chunk": n, "start": chunk.start, "end": chunk.end})
    return out_ids, out_values, out_payloads


class QdrantSink:
    """Creates the collection on first use (its size from the first vectors) and upserts."""

    def __init__(self, client: Any, collection: str, kind: str):
        self.client = client
        self.collection = collection
        self.kind = kind
        self._ready = client.collection_exists(collection)

    def _create(self, values: Sequence[Any]) -> None:
        from qdrant_client import models  # noqa: PLC0415 - optional dependency

        if self.kind == "sparse":
            self.client.create_collection(
                self.collection,
                vectors_config={},
                sparse_vectors_config={SPARSE_VECTOR_NAME: models.SparseVectorParams()},
            )
        elif self.kind == "multivector":
            size = int(np.asarray(values[0]).shape[1])
            self.client.create_collection(
                self.collection,
                vectors_config=models.VectorParams(
                    size=size,
                    distance=models.Distance.COSINE,
                    multivector_config=models.MultiVectorConfig(
                        comparator=models.MultiVectorComparator.MAX_SIM
                    ),
                ),
            )
        else:
            size = int(np.asarray(values[0]).shape[-1])
            self.client.create_collection(
                self.collection,
                vectors_config=models.VectorParams(size=size, distance=models.Distance.COSINE),
            )
        self._ready = True

    def _vector(self, value: Any) -> Any:
        from qdrant_client import models  # noqa: PLC0415 - optional dependency

        if self.kind == "sparse":
            indices, values = value
            return {
                SPARSE_VECTOR_NAME: models.SparseVector(
                    indices=np.asarray(indices).tolist(), values=np.asarray(values).tolist()
                )
            }
        return np.asarray(value, dtype=np.float32).tolist()

    def upsert(self, ids: Sequence[str], values: Sequence[Any], payloads: Sequence[dict]) -> None:
        """Upsert one shard's rows (nothing for an empty shard); chunks as each row's list."""
        if self.kind == "chunks" and ids:  # a point per chunk, id and span in payload
            ids, values, payloads = chunk_points(ids, values, payloads)
        self._upsert_points(ids, values, payloads)

    def _upsert_points(
        self, ids: Sequence[str], values: Sequence[Any], payloads: Sequence[dict]
    ) -> None:
        """Upsert points, a chunk's with ``chunk``, ``start``, ``end`` in its payload."""
        from qdrant_client import models  # noqa: PLC0415 - optional dependency

        if not ids:
            return
        if not self._ready:
            self._create(values)
        # A chunk's point: uuid5 of "<row id>#<chunk index>", stable across runs too.
        keys = [f"{i}#{p['chunk']}" for i, p in zip(ids, payloads, strict=True)] if (
            self.kind == "chunks"
        ) else ids
        points = [
            models.PointStruct(id=point_id(k), vector=self._vector(v), payload={"id": i, **p})
            for k, i, v, p in zip(keys, ids, values, payloads, strict=True)
        ]
        for start in range(0, len(points), 256):
            self.client.upsert(self.collection, points[start : start + 256], wait=True)

    def upsert_table(self, table: Any) -> None:
        """Upsert the rows of a shard file read back (a resumed run's shards not yet sent)."""
        data = table.to_pydict()
        ids = data.pop("id")
        if self.kind == "chunks":
            values = data.pop("embedding")
            for name in ("tokens", "chunks"):
                data.pop(name)
            payloads = [{k: data[k][n] for k in data} for n in range(len(ids))]
            self._upsert_points(ids, values, payloads)  # one row per chunk already
            return
        if self.kind == "sparse":
            values = list(zip(data.pop("indices"), data.pop("values"), strict=True))
        else:
            values = data.pop("embedding")
        payloads = [{k: data[k][n] for k in data} for n in range(len(ids))]
        self.upsert(ids, values, payloads)
