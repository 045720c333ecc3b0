"""bench.faults.soak sends each load's largest requests first, from as many clients as the run."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from bench.faults.soak import Load, warm_shapes


class Recorder:
    """A sender that records what it was given; refuses requests holding b"bad"."""

    def __init__(self, seen: list[list[bytes]], lock: threading.Lock):
        self.seen, self.lock = seen, lock

    def prepare(self, items: Sequence[bytes]) -> list[bytes]:
        return list(items)

    def send(self, prepared: list[bytes]) -> int:
        with self.lock:
            self.seen.append(prepared)
        if b"bad" in prepared:
            raise RuntimeError("refused")
        return len(prepared)

    def close(self) -> None:
        pass


def test_the_largest_requests_are_the_ones_with_the_most_bytes() -> None:
    load = Load("text", lambda: None, [[b"a"], [b"bb", b"cc"], [b"dddddd"], [b"e"] * 3])
    assert load.largest(2) == [[b"bb", b"cc"], [b"dddddd"]]


def test_every_client_sends_the_largest_requests_each_round_and_errors_are_counted() -> None:
    seen: list[list[bytes]] = []
    lock = threading.Lock()
    text = Load("text", lambda: Recorder(seen, lock), [[b"x"], [b"yyyy"], [b"zzzzzz"]])
    bad = Load("bad", lambda: Recorder(seen, lock), [[b"bad"], [b"ok"]])
    done = warm_shapes([text, bad], clients=3, rounds=2)
    assert done == {"text": {"requests": 12, "errors": 0}, "bad": {"requests": 12, "errors": 6}}
    # Only the two largest of each load were sent: never the one-byte request.
    assert [b"x"] not in seen
    assert seen.count([b"yyyy"]) == seen.count([b"zzzzzz"]) == 6
    # The soak's own counters are left for the timed run.
    assert text.requests_done == bad.requests_done == 0
