"""Fetch the URLs of many requests concurrently; answer each request when its URLs are done.

The ``fetch_image`` model hands every request of a batch to :meth:`FetchPool.fetch_groups`
and answers each from its callback, so a slow URL delays only its own request.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from ..errors import RequestError, UnavailableError
from .url_fetch import ByteBudget, FetchPolicy, fetch_url, shown_url

Results = list[bytes | RequestError]


class FetchPool:
    """Fetches the URLs of each batch concurrently on threads built once.

    At most ``max_concurrency`` distinct URLs are in flight over all batches:
    :meth:`fetch_groups` blocks while that many are, instead of queueing without limit.
    """

    def __init__(self, policy: FetchPolicy, max_concurrency: int):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency!r}")
        self.policy = policy
        self._slots = threading.Semaphore(max_concurrency)
        self._executor = ThreadPoolExecutor(max_concurrency, thread_name_prefix="fetch")

    def fetch_groups(
        self, groups: Sequence[Sequence[str]], on_done: Callable[[int, Results], None]
    ) -> None:
        """Start fetching every URL of ``groups`` (one group per request).

        Returns once every URL has started: at once, unless ``max_concurrency`` URLs are
        in flight, then as soon as enough of them finish.

        ``on_done(i, results)`` is called exactly once per group, as soon as the URLs of
        group ``i`` are done, on a fetch thread (or on this one, e.g. for an empty group);
        ``results`` follow the group's order, a failure being a ``RequestError``. The URLs
        of one call share one :class:`ByteBudget` of ``max_batch_bytes``; a URL repeated
        in the call is fetched once. ``on_done`` must not raise.
        """
        budget = ByteBudget(self.policy.max_batch_bytes)
        tracker = _Groups(groups, on_done)
        tracker.finish_empty()
        for url in tracker.urls:
            self._slots.acquire()
            try:
                future = self._executor.submit(_fetch_or_error, url, self.policy, budget)
            except RuntimeError:
                self._slots.release()
                tracker.done(url, _shutting_down(url))
                continue
            future.add_done_callback(functools.partial(self._finished, tracker, url))

    def fetch(self, urls: Sequence[str]) -> Results:
        """The results of ``urls`` in order, once all are done (one batch)."""
        box: list[Results] = []
        done = threading.Event()

        def keep(_i: int, results: Results) -> None:
            box.append(results)
            done.set()

        self.fetch_groups([urls], keep)
        done.wait()
        return box[0]

    def close(self) -> None:
        """Stop the threads; fetches not started yet end as ``UnavailableError``."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _finished(self, tracker: _Groups, url: str, future: Future) -> None:
        self._slots.release()
        tracker.done(url, _shutting_down(url) if future.cancelled() else future.result())


class _Groups:
    """Which groups wait on which URL; calls ``on_done`` once per group when complete."""

    def __init__(self, groups: Sequence[Sequence[str]], on_done: Callable[[int, Results], None]):
        self._groups = [list(g) for g in groups]
        self._on_done = on_done
        self._lock = threading.Lock()
        self._results: dict[str, bytes | RequestError] = {}
        self._members: dict[str, list[int]] = {}
        for i, group in enumerate(self._groups):
            for url in dict.fromkeys(group):
                self._members.setdefault(url, []).append(i)
        self._waiting = [len(dict.fromkeys(g)) for g in self._groups]
        self.urls = list(self._members)

    def finish_empty(self) -> None:
        for i, group in enumerate(self._groups):
            if not group:
                self._on_done(i, [])

    def done(self, url: str, result: bytes | RequestError) -> None:
        ready = []
        with self._lock:
            self._results[url] = result
            for i in self._members[url]:
                self._waiting[i] -= 1
                if self._waiting[i] == 0:
                    ready.append((i, [self._results[u] for u in self._groups[i]]))
        for i, results in ready:
            self._on_done(i, results)


def _label(url: object) -> str:
    return shown_url(url) if isinstance(url, str) else type(url).__name__


def _shutting_down(url: str) -> RequestError:
    return UnavailableError(f"IMAGE_URL '{_label(url)}' unavailable: the model is shutting down")


def _fetch_or_error(url: str, policy: FetchPolicy, budget: ByteBudget) -> bytes | RequestError:
    try:
        return fetch_url(url, policy, budget)
    except RequestError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - one bad URL must not fail the batch
        reason = f"internal error ({type(exc).__name__})"
        return RequestError(f"IMAGE_URL '{_label(url)}' failed: {reason}")
