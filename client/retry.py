"""Retries of refused requests: jittered backoff inside the call's deadline and a retry budget.

A request the server refuses (a full queue, a queue timeout: HTTP 503 / 429, gRPC
``UNAVAILABLE`` / ``RESOURCE_EXHAUSTED``) or cannot take (connection refused or reset, a
restarting server) is sent again after a full-jitter exponential backoff (a uniform draw
in ``[0, min(cap_s, base_s * 2 ** (n - 1))]`` before retry n), never sleeping past the
call's deadline, and only while the :class:`RetryBudget` has a token. A request the
server answered with anything else (bad input, unknown model, its deadline passed) is
never retried.

The budget is a token bucket, as Finagle's ``RetryBudget`` and gRPC's retry throttling:
each request's first attempt deposits ``ratio`` tokens (0.1), time deposits
``min_per_s`` tokens a second (1), the balance is capped at ``burst`` (10, where it
starts), and each retry takes one token. Over any stretch of T seconds with N requests,
retries <= burst + ratio * N + min_per_s * T: under sustained overload at most 10 % of
requests are retried, plus the small floor that lets a client at a few requests a second
ride out a restart (burst 10 over the first seconds, then one a second). Each client
object has its own budget unless one is shared; the floor is per budget, so threads of
one process that share a budget share its floor. A floor of 10 a second (Finagle's
default) is too much for a client that sends one request at a time: its refused calls
last until their deadline, so its retries ran at the floor's rate, 9 x its requests in a
simulation of 10,000 refused calls (``tests/unit/client/test_retry.py``).
"""

from __future__ import annotations

import enum
import http.client
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from .deadline import Deadline
from .errors import DeadlineExceededError, EmbeddingClientError, ServerOverloadedError

T = TypeVar("T")

# Refusals (Triton's own overload answers); a 503 / UNAVAILABLE for another reason (an
# image URL the server could not fetch, a restricted API) is the request's own answer.
RETRY_STATUSES = frozenset(
    {"503", "429", "StatusCode.UNAVAILABLE", "StatusCode.RESOURCE_EXHAUSTED"}
)
ALWAYS_RETRY_STATUSES = frozenset({"429", "StatusCode.RESOURCE_EXHAUSTED"})
REFUSAL_MARKERS = ("exceeds maximum queue size", "request timeout expired", "overload")
# gRPC's own words (status UNAVAILABLE) for a server it could not reach or that went away
# mid-call; the server's answers say "connection reset" etc. of an image URL it fetched.
GRPC_UNAVAILABLE = "StatusCode.UNAVAILABLE"
CONNECTION_MARKERS = (
    "failed to connect",
    "socket closed",
    "connection reset by peer",
    "broken pipe",
    "goaway",
)
DEADLINE_STATUSES = frozenset({"StatusCode.DEADLINE_EXCEEDED"})
# The server's answer to a request whose deadline passed (or whose client had gone)
# before a step ran: UNAVAILABLE with this word in the message.
DEADLINE_MARKER = "deadline"


class Failure(enum.Enum):
    """What a failed attempt means for the request."""

    REFUSED = "refused"  # the server refused it: retry
    UNREACHABLE = "unreachable"  # the server could not be reached: retry
    DEADLINE = "deadline"  # the deadline passed: never retry
    FINAL = "final"  # the request's own answer: never retry


def classify(error: EmbeddingClientError) -> Failure:
    """The kind of ``error``, from its status and message and the transport error behind it."""
    cause = error.__cause__
    if isinstance(cause, TimeoutError):
        return Failure.DEADLINE
    if isinstance(cause, (OSError, http.client.HTTPException)):
        return Failure.UNREACHABLE
    status, message = error.status or "", error.message.lower()
    if status in DEADLINE_STATUSES:
        return Failure.DEADLINE
    if status not in RETRY_STATUSES:
        return Failure.FINAL
    if DEADLINE_MARKER in message:
        return Failure.DEADLINE
    if status in ALWAYS_RETRY_STATUSES or any(m in message for m in REFUSAL_MARKERS):
        return Failure.REFUSED
    if status == GRPC_UNAVAILABLE and any(m in message for m in CONNECTION_MARKERS):
        return Failure.UNREACHABLE
    return Failure.FINAL


@dataclass(frozen=True)
class RetryPolicy:
    """How refused requests are retried (see the module's docstring).

    ``base_s`` / ``cap_s``: the backoff before retry n is a uniform draw in
    ``[0, min(cap_s, base_s * 2 ** (n - 1))]``. ``max_attempts``: attempts per request
    (None: as many as the deadline and the budget allow; 1: no retries).
    ``min_attempt_s``: a retry is made only when this much time is left after its
    backoff. ``clock`` (monotonic), ``wall_clock`` (Unix time), ``sleep`` and ``random``
    (a uniform draw in [0, 1)) are injectable for tests.
    """

    base_s: float = 0.05
    cap_s: float = 2.0
    max_attempts: int | None = None
    min_attempt_s: float = 0.01
    clock: Callable[[], float] = field(default=time.monotonic, compare=False, repr=False)
    wall_clock: Callable[[], float] = field(default=time.time, compare=False, repr=False)
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False, repr=False)
    random: Callable[[], float] = field(default=random.random, compare=False, repr=False)

    def backoff_s(self, retry: int) -> float:
        """The full-jitter wait before retry number ``retry`` (1 for the first retry)."""
        return self.random() * min(self.cap_s, self.base_s * 2 ** (retry - 1))

    def deadline(self, seconds: float) -> Deadline:
        """A deadline ``seconds`` from now on this policy's clocks."""
        return Deadline(seconds, self.clock, self.wall_clock)


DEFAULT_RETRY = RetryPolicy()
NO_RETRY = RetryPolicy(max_attempts=1)


class RetryBudget:
    """Tokens for retries, shared by the clients given it (thread-safe; see the module)."""

    def __init__(
        self,
        ratio: float = 0.1,
        min_per_s: float = 1.0,
        burst: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.ratio = ratio
        self.min_per_s = min_per_s
        self.burst = burst
        self._clock = clock
        self._balance = burst
        self._last = clock()
        self._lock = threading.Lock()
        self.requests = 0  # first attempts seen
        self.retries = 0  # retries allowed
        self.denied = 0  # retries refused for want of a token

    def _refill(self, deposit: float) -> None:
        now = self._clock()
        earned = self.min_per_s * max(0.0, now - self._last) + deposit
        self._balance = min(self.burst, self._balance + earned)
        self._last = now

    def deposit(self) -> None:
        """A request's first attempt: ``ratio`` tokens."""
        with self._lock:
            self.requests += 1
            self._refill(self.ratio)

    def withdraw(self) -> bool:
        """Take a token for one retry; False (and no retry) when there is none."""
        with self._lock:
            self._refill(0.0)
            if self._balance < 1.0:
                self.denied += 1
                return False
            self._balance -= 1.0
            self.retries += 1
            return True


def call_with_retries(
    attempt: Callable[[], T],
    deadline: Deadline,
    policy: RetryPolicy,
    budget: RetryBudget,
    model: str | None = None,
) -> T:
    """``attempt()``, retried on refusals within ``deadline``, ``policy`` and ``budget``.

    ``attempt`` raises :class:`EmbeddingClientError` (its ``__cause__`` the transport
    error, if any). Raises :class:`ServerOverloadedError` when no further attempt is
    allowed, :class:`DeadlineExceededError` when the deadline passed, and any other
    error at once.
    """
    budget.deposit()
    attempts = 0
    while True:
        if deadline.remaining() <= 0:
            raise DeadlineExceededError(
                f"deadline of {deadline.seconds:g} s passed before the request was sent",
                model=model,
            )
        attempts += 1
        try:
            return attempt()
        except EmbeddingClientError as exc:
            kind = classify(exc)
            if kind is Failure.FINAL:
                raise
            if kind is Failure.DEADLINE:
                raise DeadlineExceededError(
                    f"deadline of {deadline.seconds:g} s passed (attempt {attempts}): "
                    f"{exc.message}",
                    exc.status,
                    model,
                ) from exc
            last, last_kind = exc, kind
        reason = _wait_for_retry(attempts, deadline, policy, budget)
        if reason is None:
            continue
        head = "server unreachable" if last_kind is Failure.UNREACHABLE else "server overloaded"
        plural = "s" if attempts > 1 else ""
        raise ServerOverloadedError(
            f"{head}: {attempts} attempt{plural} in {deadline.elapsed():.2f} s, {reason}; "
            f"last {'error' if last_kind is Failure.UNREACHABLE else 'refusal'}: {last.message}",
            last.status,
            model,
            attempts=attempts,
            last_error=last,
        ) from last


def _wait_for_retry(
    attempts: int, deadline: Deadline, policy: RetryPolicy, budget: RetryBudget
) -> str | None:
    """Sleep the backoff before a retry and return None, or say why no retry is allowed."""
    if policy.max_attempts is not None and attempts >= policy.max_attempts:
        return "retries are off" if policy.max_attempts == 1 else "max_attempts reached"
    delay = policy.backoff_s(attempts)
    if deadline.remaining() - delay < policy.min_attempt_s:
        return f"the deadline ({deadline.seconds:g} s) leaves no time for another attempt"
    if not budget.withdraw():
        return "the retry budget is spent"
    policy.sleep(delay)
    return None
