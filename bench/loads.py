"""The benchmark's loads: which clients x items, how many requests, how long at most."""

from __future__ import annotations

from dataclasses import dataclass, replace

from client.load.loadgen import LoadSpec
from client.load.workload import image_requests, text_requests

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
    def request_count(self) -> int:
        """Requests of all clients together, warm-up included."""
        return self.spec.clients * (self.spec.warmup_requests + self.spec.requests_per_client)

    def text_requests(self, pool: list[str]) -> list[list[bytes]]:
        """The load's requests, cycling through the sentences of ``pool``."""
        return text_requests(pool, self.spec.items_per_request, self.request_count)

    def image_requests(
        self, model: str, urls: list[str], photos: dict[str, bytes]
    ) -> tuple[str, str, list[list[bytes]]]:
        """``(ensemble, input name, requests)`` of ``model``: by URL or raw bytes, by kind."""
        if self.kind == IMAGE_URL:
            items = [u.encode() for u in urls]
            model, name = f"{model}_image_url", "IMAGE_URL"
        else:
            items = [photos[n] for n in sorted(photos)]
            model, name = f"{model}_image", "IMAGE"
        return model, name, image_requests(items, self.spec.items_per_request, self.request_count)


def scaled(loads: list[BenchLoad], scale: float) -> list[BenchLoad]:
    """``loads`` with ``scale`` times the requests per client (a fast GPU needs more)."""
    def more(spec: LoadSpec) -> LoadSpec:
        return replace(spec, requests_per_client=max(1, round(spec.requests_per_client * scale)))

    return [replace(load, spec=more(load.spec)) for load in loads]


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
