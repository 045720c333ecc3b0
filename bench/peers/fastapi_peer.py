"""The hand-rolled peer: FastAPI + sentence-transformers, one library call per request.

``BENCH_PEER=embed``: ``POST /embed`` ``{"texts"}`` -> ``{"embeddings"}`` (L2-normalised,
``SentenceTransformer.encode``); ``rerank``: ``POST /rerank`` ``{"query", "texts"}`` ->
``{"scores"}`` (``CrossEncoder.predict``). No batching across requests; the model from
``BENCH_MODEL_PATH``, the torch device from ``BENCH_DEVICE``.
"""

from __future__ import annotations

import os

from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import CrossEncoder, SentenceTransformer

KIND = os.environ.get("BENCH_PEER", "embed")
MODEL_PATH = os.environ["BENCH_MODEL_PATH"]
DEVICE = os.environ.get("BENCH_DEVICE", "cpu")

app = FastAPI(title=f"fastapi + sentence-transformers peer ({KIND})")
model = (CrossEncoder if KIND == "rerank" else SentenceTransformer)(MODEL_PATH, device=DEVICE)


class Texts(BaseModel):
    """The texts to embed, or to score against ``query`` (rerank)."""

    texts: list[str]
    query: str = ""


@app.get("/health")
def health() -> dict[str, str]:
    """Liveness: the model is loaded when the app is importable."""
    return {"status": "ok"}


@app.post("/embed")
def embed(request: Texts) -> dict[str, list[list[float]]]:
    """Embed the request's texts with one ``encode`` call."""
    vectors = model.encode(request.texts, normalize_embeddings=True, convert_to_numpy=True)
    return {"embeddings": vectors.tolist()}


@app.post("/rerank")
def rerank(request: Texts) -> dict[str, list[float]]:
    """Score the request's pairs with one ``predict`` call."""
    scores = model.predict([(request.query, t) for t in request.texts], batch_size=32)
    return {"scores": [float(s) for s in scores]}
