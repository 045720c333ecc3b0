"""The hand-rolled peer: FastAPI + sentence-transformers, one ``encode`` per request.

This is how most home-made embedding services look: a synchronous endpoint (FastAPI
runs it in its thread pool) that calls ``SentenceTransformer.encode`` on the request's
texts, with no batching across requests. Run it as::

    BENCH_MODEL_PATH=/path/to/model python -m uvicorn bench.peers.fastapi_st:app \
        --host 127.0.0.1 --port 8100

``POST /embed`` with ``{"texts": [...]}`` returns ``{"embeddings": [[...], ...]}``
(L2-normalised); ``GET /health`` answers once the model is loaded.
``BENCH_DEVICE`` picks the torch device (``cpu`` by default, ``cuda`` for GPU runs).
"""

from __future__ import annotations

import os

from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer

MODEL_PATH = os.environ.get("BENCH_MODEL_PATH", "sentence-transformers/all-MiniLM-L6-v2")
DEVICE = os.environ.get("BENCH_DEVICE", "cpu")

app = FastAPI(title="fastapi + sentence-transformers peer")
model = SentenceTransformer(MODEL_PATH, device=DEVICE)


class EmbedRequest(BaseModel):
    """A list of texts to embed."""

    texts: list[str]


@app.get("/health")
def health() -> dict[str, str]:
    """Liveness: the model is loaded when the app is importable."""
    return {"status": "ok"}


@app.post("/embed")
def embed(request: EmbedRequest) -> dict[str, list[list[float]]]:
    """Embed the request's texts with one ``encode`` call."""
    vectors = model.encode(request.texts, normalize_embeddings=True, convert_to_numpy=True)
    return {"embeddings": vectors.tolist()}
