"""Preprocessing cost per benchmark photo, with and without the opt-in JPEG draft decode.

    python -m bench.studies.image_decode

For each of the benchmark's 12 generated photos: the best of 5 timings of
``open_image`` + ``preprocess_opened`` (decode, resize, crop, normalise to 224x224) in
this process, exact and with ``draft_decode``, and how far the draft pixels are from the
exact ones (max and mean absolute difference in normalised units, cosine).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from client.load.workload import generated_images
from embed_runtime.image.preprocess import PreprocessParams, open_image, preprocess_opened


def best_of(data: bytes, params: PreprocessParams, repeats: int = 5):
    """(best seconds, pixels) of preprocessing ``data`` with ``params``."""
    best, pixels = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        pixels = preprocess_opened(open_image(data, params), params)
        best = min(best, time.perf_counter() - start)
    return best, pixels


def main() -> int:
    """Print one line per photo and the means; returns 0."""
    exact = PreprocessParams(size=(224, 224))
    draft = dataclasses.replace(exact, draft_decode=True)
    totals = [0.0, 0.0]
    photos = generated_images()
    print(f"{'photo':28s} {'exact ms':>8s} {'draft ms':>8s} {'max|d|':>7s} {'mean|d|':>8s} cos")
    for name, data in photos.items():
        t_exact, p_exact = best_of(data, exact)
        t_draft, p_draft = best_of(data, draft)
        totals[0] += t_exact
        totals[1] += t_draft
        diff = np.abs(p_exact - p_draft)
        cos = float(p_exact.ravel() @ p_draft.ravel()) / (
            np.linalg.norm(p_exact) * np.linalg.norm(p_draft)
        )
        print(
            f"{name:28s} {t_exact * 1e3:8.1f} {t_draft * 1e3:8.1f} "
            f"{diff.max():7.3f} {diff.mean():8.4f} {cos:.5f}"
        )
    n = len(photos)
    print(f"{'mean':28s} {totals[0] / n * 1e3:8.1f} {totals[1] / n * 1e3:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
