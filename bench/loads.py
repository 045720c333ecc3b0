"""The benchmark's loads: which clients x items, how many requests, how long at most."""

from __future__ import annotations

from dataclasses import dataclass, replace

from client.load.loadgen import LoadSpec

TEXT = "text"
IMAGE = "image"
IMAGE_URL = "image_url"


@dataclass(frozen=True)
class BenchLoad:
    """One named load on one kind of ensemble."""

    key: str
    kind: str
    spec: LoadSpec

    @property
    def concurrency(self) -> int:
        """Number of concurrent clients."""
        return self.spec.clients


def scaled(loads: list[BenchLoad], scale: float) -> list[BenchLoad]:
    """``loads`` with ``scale`` times the requests per client (a fast GPU needs more)."""
    return [
        replace(
            load,
            spec=replace(
                load.spec, requests_per_client=max(1, round(load.spec.requests_per_client * scale))
            ),
        )
        for load in loads
    ]


def text_loads(quick: bool, scale: float = 1.0) -> list[BenchLoad]:
    """1 x 1 (latency), 4 x 1, 16 x 1 (concurrency) and 4 x 32 (client batches)."""
    if quick:
        return [
            BenchLoad("1 x 1", TEXT, LoadSpec(1, 1, 30, 3, 3.0)),
            BenchLoad("4 x 1", TEXT, LoadSpec(4, 1, 10, 1, 3.0)),
            BenchLoad("16 x 1", TEXT, LoadSpec(16, 1, 5, 1, 3.0)),
            BenchLoad("4 x 32", TEXT, LoadSpec(4, 32, 1, 1, 4.0)),
        ]
    return scaled(
        [
            BenchLoad("1 x 1", TEXT, LoadSpec(1, 1, 250, 10, 12.0)),
            BenchLoad("4 x 1", TEXT, LoadSpec(4, 1, 120, 3, 12.0)),
            BenchLoad("16 x 1", TEXT, LoadSpec(16, 1, 80, 2, 12.0)),
            BenchLoad("4 x 32", TEXT, LoadSpec(4, 32, 12, 1, 14.0)),
        ],
        scale,
    )


def image_loads(quick: bool, scale: float = 1.0) -> list[BenchLoad]:
    """8 clients x 1 image, by URL and as raw bytes."""
    spec = LoadSpec(8, 1, 2, 1, 4.0) if quick else LoadSpec(8, 1, 30, 1, 12.0)
    loads = [BenchLoad("8 x 1 url", IMAGE_URL, spec), BenchLoad("8 x 1 bytes", IMAGE, spec)]
    return loads if quick else scaled(loads, scale)
