"""The hand-rolled reranking peer: FastAPI + ``CrossEncoder.predict``, one call per request.

    BENCH_MODEL_PATH=/path/to/cross-encoder python -m uvicorn bench.peers.fastapi_ce:app \
        --host 127.0.0.1 --port 8101

``POST /rerank`` with ``{"query": "...", "texts": [...]}`` returns ``{"scores": [...]}``;
``GET /health`` answers once the model is loaded.
"""

from __future__ import annotations

import os

from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import CrossEncoder

MODEL_PATH = os.environ.get("BENCH_MODEL_PATH", "cross-encoder/ms-marco-MiniLM-L6-v2")
DEVICE = os.environ.get("BENCH_DEVICE", "cpu")

app = FastAPI(title="fastapi + CrossEncoder peer")
model = CrossEncoder(MODEL_PATH, device=DEVICE)


class RerankRequest(BaseModel):
    """One query and the texts to score against it."""

    query: str
    texts: list[str]


@app.get("/health")
def health() -> dict[str, str]:
    """Liveness: the model is loaded when the app is importable."""
    return {"status": "ok"}


@app.post("/rerank")
def rerank(request: RerankRequest) -> dict[str, list[float]]:
    """Score the request's pairs with one ``predict`` call."""
    scores = model.predict([(request.query, t) for t in request.texts], batch_size=32)
    return {"scores": [float(s) for s in scores]}
