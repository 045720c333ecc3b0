"""Whether a request is still wanted when a step is about to work on it.

Two ways a request stops being wanted, both checked by every Python step before it reads
a request (:func:`embed_runtime.serving.adapter.gather_rows`), so no fetch, decode,
tokenize or encode work is done for a client that can no longer use the answer:

- its client has gone: Triton marks the request cancelled when an HTTP client closes its
  connection or a gRPC call passes its deadline (``request.is_cancelled()``, Triton
  23.10+); an ensemble passes the cancellation on to the step that runs next.
- its deadline has passed: the request parameter :data:`DEADLINE_PARAMETER`, an absolute
  wall-clock time in microseconds since the Unix epoch. Triton's own ``timeout`` request
  parameter is not passed from an ensemble to its steps (measured on Triton 2.51), and
  it restarts at every step's queue; an absolute time reaches every step unchanged
  (ensembles forward request parameters) and means the same in each. The project's
  client sends it with every request (``client.deadline``).

Both answers are Triton ``UNAVAILABLE`` with a message that says which, so a client
retries them only while its own deadline allows.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UnavailableError
from ..ops.backlog_board import COST_WEIGHT, Admission, Backlog, board_path
from ..ops.cost_model import Cost, features
from .refusals import Refusals

DEADLINE_PARAMETER = "deadline_unix_us"


class RequestGoneError(UnavailableError):
    """The request's client has gone or its deadline has passed; no work was done for it."""


def wall_clock_us() -> int:
    """Microseconds since the Unix epoch (the clock :data:`DEADLINE_PARAMETER` is read on)."""
    return time.time_ns() // 1000


def deadline_us(parameters: Mapping[str, Any]) -> int | None:
    """The request's deadline (µs since the epoch), ``None`` when it carries none or a bad one.

    A value that is not a positive integer is treated as no deadline: the parameter only
    ever withholds work, so a malformed one must not fail a request that is otherwise good.
    """
    value = parameters.get(DEADLINE_PARAMETER)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None
    try:
        deadline = int(value)
    except ValueError:
        return None
    return deadline if deadline > 0 else None


def gone_reason(
    request: Any,
    parameters: Callable[[Any], Mapping[str, Any]],
    now_us: Callable[[], int] = wall_clock_us,
) -> RequestGoneError | None:
    """Why ``request`` is no longer wanted, or ``None`` when it still is.

    ``parameters(request)`` gives the request's parameters; ``now_us`` is the wall clock.
    """
    is_cancelled = getattr(request, "is_cancelled", None)
    if is_cancelled is not None and is_cancelled():
        return RequestGoneError(
            "request cancelled: its client closed the connection or passed its deadline "
            "before this step ran"
        )
    deadline = deadline_us(parameters(request))
    if deadline is not None:
        late_us = now_us() - deadline
        if late_us >= 0:
            return RequestGoneError(
                f"deadline passed {late_us / 1000:.1f} ms before this step ran "
                f"(request parameter {DEADLINE_PARAMETER})"
            )
    return None


def request_deadline_us(
    request: Any, parameters: Mapping[str, Any], now_us: Callable[[], int] = wall_clock_us
) -> int | None:
    """When ``request`` must be answered by (µs since the epoch), ``None`` when it does not say.

    The earlier of :data:`DEADLINE_PARAMETER` and Triton's own ``timeout`` request
    parameter (``request.timeout()``, µs, 0 when unset), counted from now: the admitting
    step is a request's first step, so now is about when it arrived. A gRPC deadline
    reaches no step as a number; Triton cancels the request when it passes.
    """
    deadline = deadline_us(parameters)
    timeout = getattr(request, "timeout", None)
    relative = timeout() if timeout is not None else 0
    if isinstance(relative, int) and relative > 0:
        by_timeout = now_us() + relative
        deadline = by_timeout if deadline is None else min(deadline, by_timeout)
    return deadline


ADMISSION_ENCODER = "admission_encoder"
ADMISSION_WAIT = "admission_wait_us"
ADMISSION_ROWS = "admission_max_rows"
# Set ("true") on a step that an admitting step in front counts for, other than an encoder
# (which always counts): image preprocessing behind ``<name>_admit_image``.
BACKLOG_PARAMETER = "admission_backlog"
# Set ("true") on an admitting step that refuses while the queue is full but counts
# nothing it passes on: ``<name>_admit_url``, in front of the URL fetch.
ADMISSION_PEEK = "admission_peek"
# The tensor an admitting step sends each request's ticket in, and the one the step it
# admits to takes it as: [rows, TICKET_WIDTH] INT64, each row the same (row ticket,
# deadline µs or 0, when it was admitted µs, the admission's estimate of its wait µs or 0,
# work ticket ns).
ISSUED_TICKET = "issued_ticket"
ADMITTED_TICKET = "admitted_ticket"
TICKET_WIDTH = 5
# A request parameter: parts a step in front admitted as one unit (``<name>_chunks``) carry
# the encoder board's key in it, so the admitting step counts them without weighing each
# behind the others. Nobody outside the server knows the key; a wrong one is weighed.
GRANT_PARAMETER = "admission_grant"
# A row of text is priced at this many tokens a byte until its step learns its own.
TOKENS_PER_BYTE = 0.3
# A request with a deadline is admitted while the wait ahead of it is within this share of
# the time it has left after its own work (twice its own time admits a long request): one
# admitted just after a batch formed waits for two executions. Spikes of one-sentence
# requests, 1 s deadline, 2-core host (bench.faults.overload, 2026-12-05, the old rule):
# 0.8 answered 90 / 344 late at 2 x / 3 x, 0.6 24 / 16, 0.5 0 / 2, the same goodput.
DEADLINE_SHARE = 0.5
# Estimates shorter than this are not compared with what happened: a lone request's wait
# is mostly fixed costs the estimate leaves out, and a deadline that short is rare.
OBSERVED_FROM_US = 50_000


class OverloadedError(UnavailableError):
    """The encoder's queue already holds more work than the model admits; none was done."""


class AdmissionGate:
    """Admits the requests of one execution while the encoder's queue has room for them.

    Built by the step in front of an encoder from its config parameters
    (:data:`ADMISSION_ENCODER`, :data:`ADMISSION_WAIT`, :data:`ADMISSION_ROWS`).
    :meth:`begin` reads the encoder's backlog board once per execution; :meth:`admit` is
    asked for each request in order, with its rows' token counts (estimated from their
    bytes before this step tokenized them: :meth:`weigh`) and its deadline. Everything is
    priced by the encoder's learned cost of tokens (:mod:`embed_runtime.ops.cost_model`):

    - the wait *ahead* of a request is bounded, never its own size: a request with nothing
      ahead of it is admitted whatever its rows;
    - every request is refused while ``max_rows`` rows already wait (the memory the queue
      may hold);
    - a request that states a deadline is refused at once when the estimated time to its
      answer (the work ahead and its own) exceeds :data:`DEADLINE_SHARE` of the time it
      has left, and admitted otherwise;
    - one that states none is queued, as Triton queues it, while less than ``wait_us`` of
      estimated work waits ahead of it (the longest wait a client is asked to sit
      through), past it refused at once.

    :meth:`tickets` numbers the rows and the work passed on, so the encoder's board counts
    only what the encoder has still to take (:mod:`embed_runtime.ops.backlog_board`).
    """

    def __init__(
        self,
        board: Admission,
        encoder: str,
        wait_us: int,
        max_rows: int = 0,
        refusals: Refusals | None = None,
        now_us: Callable[[], int] = wall_clock_us,
        max_tokens: int = 0,
    ):
        self.board, self.encoder, self.wait_us, self.max_rows = board, encoder, wait_us, max_rows
        self.refusals, self.now_us = refusals, now_us
        # Text steps: rows are priced by tokens, at most the model's window; 0: no tokens.
        self.max_tokens = max_tokens
        self.tokens_per_byte = TOKENS_PER_BYTE
        self._read = Backlog(0)
        self._rows, self._work = 0, 0.0  # admitted by this execution so far: they wait too
        self._idle_checked = False
        self.estimate_us = 0  # the estimate the last admitted request was admitted on
        self._grant = board.secret
        # What it admits is interactive traffic (embed_runtime.ops.backlog_board.BulkSlots);
        # not so for the chunks step, whose requests are documents.
        self.interactive = True

    @classmethod
    def from_parameters(
        cls,
        params: Mapping[str, str],
        version: str,
        pb_utils: Any = None,
        model: str = "",
        max_tokens: int = 0,
    ) -> AdmissionGate | None:
        """The gate a step's config asks for, or ``None`` where it admits everything.

        With ``pb_utils`` (inside Triton) its refusals are counted (:class:`Refusals`)
        under the step's name ``model``. ``max_tokens``: a text step's window (rows are
        priced by their tokens); 0 for images.
        """
        encoder = params.get(ADMISSION_ENCODER, "")
        wait_us = int(params.get(ADMISSION_WAIT, "0") or 0)
        max_rows = int(params.get(ADMISSION_ROWS, "0") or 0)
        if not encoder or (wait_us <= 0 and max_rows <= 0):
            return None
        refusals = None if pb_utils is None else Refusals.for_step(pb_utils, model, encoder)
        board = Admission(board_path(encoder, version))
        return cls(
            board, encoder, max(wait_us, 0), max(max_rows, 0), refusals, max_tokens=max_tokens
        )

    def begin(self) -> None:
        """Read the backlog once for this execution."""
        self._read = self.board.read()
        self._rows, self._work = 0, 0.0
        self._idle_checked = False

    def weigh(self, request: Any) -> list[int]:
        """The token counts the rows of ``request`` are priced at before it is tokenized.

        A text step prices each row by its bytes at the tokens a byte it has seen
        (:meth:`learn`), within the window; an image step counts rows alone (0 tokens).
        """
        return self.price(row_bytes(request))

    def price(self, sizes: list[int]) -> list[int]:
        """The token counts rows of these byte sizes are priced at (:meth:`weigh`)."""
        if not self.max_tokens:
            return [0] * len(sizes)
        return [min(self.max_tokens, 2 + int(size * self.tokens_per_byte)) for size in sizes]

    def learn(self, text_bytes: int, tokens: int) -> None:
        """Fold what this step tokenized in: ``tokens`` tokens from ``text_bytes`` bytes."""
        if text_bytes > 0 and tokens > 0:
            ratio = tokens / text_bytes
            self.tokens_per_byte += COST_WEIGHT * (ratio - self.tokens_per_byte)

    def granted(self, parameters: Mapping[str, Any]) -> bool:
        """Whether a step in front admitted this request already (:data:`GRANT_PARAMETER`)."""
        return parameters.get(GRANT_PARAMETER) == self._grant

    @property
    def grant(self) -> str:
        """What a step that admits parts as one unit sends with them (:data:`GRANT_PARAMETER`)."""
        return self._grant

    def _backlog(self) -> Backlog:
        read = self._read
        return dataclasses.replace(
            read, queued=read.queued + self._rows, work_ns=read.work_ns + self._work
        )

    def _over(self, lengths: list[int], deadline: int | None) -> str | None:
        """Why a request of rows with these token counts cannot be admitted now, or ``None``.

        The estimate is the board's model scaled by how the last answers compared with
        theirs (:attr:`Backlog.bias`).
        """
        backlog = self._backlog()
        ahead_ns = backlog.ahead_ns()
        self.estimate_us = int((ahead_ns + backlog.own_ns(lengths)) / 1000)
        ahead_ms = ahead_ns * backlog.bias / 1e6
        if self.max_rows and backlog.queued >= self.max_rows:
            return (
                f"server overloaded: {backlog.queued} row(s) already wait for {self.encoder}, "
                f"its bound is {self.max_rows} ({ADMISSION_ROWS}); retry later with backoff"
            )
        if deadline is not None:
            wait_ms = ahead_ms + backlog.fixed_ns / 1e6
            own_ms = backlog.own_ns(lengths) * backlog.bias / 1e6
            left_ms = (deadline - self.now_us()) / 1000
            if backlog.cost.known and wait_ms > DEADLINE_SHARE * (left_ms - own_ms):
                return (
                    f"server overloaded: about {wait_ms + own_ms:.0f} ms until {self.encoder} "
                    f"could answer ({wait_ms:.0f} ms of wait ahead of this request's "
                    f"{len(lengths)} row(s), {own_ms:.0f} ms its own), more than its own "
                    f"and {DEADLINE_SHARE:g} of the rest of the {max(left_ms, 0):.0f} ms "
                    "left before the request's deadline; retry later with backoff or a "
                    "later deadline"
                )
            return None
        if self.wait_us and ahead_ms * 1000 > self.wait_us:
            return (
                f"server overloaded: {backlog.queued} row(s) (about {ahead_ms:.0f} ms of "
                f"work) already wait for {self.encoder}, over its admission bound of "
                f"{self.wait_us / 1000:g} ms ({ADMISSION_WAIT}); retry later with backoff"
            )
        return None

    def admit(
        self, lengths: list[int], deadline: int | None = None, granted: bool = False
    ) -> OverloadedError | None:
        """``None`` to admit a request of rows with these token counts, else its refusal.

        ``deadline``: when it must be answered by (µs since the epoch), ``None`` if never;
        ``granted``: a step in front admitted it already (counted, never refused). A refusal
        is checked against idle encoders once per execution (rows never taken don't wait).
        """
        if not granted and self.interactive:
            self.board.mark_interactive()
        reason = None if granted else self._over(lengths, deadline)
        if reason is not None and not self._idle_checked and self._read.queued:
            self._idle_checked = True
            if self.board.idle():
                self.board.resync()
                self._read = dataclasses.replace(self._read, queued=0, work_ns=0.0)
                reason = self._over(lengths, deadline)
        if reason is None:
            self._rows += len(lengths)
            self._work += self._read.cost.work_ns(lengths)
            return None
        error = OverloadedError(reason)
        if self.refusals is not None:
            self.refusals.count(error.message)
        return error

    def withdraw(self, lengths: list[int]) -> None:
        """Take back rows this execution admitted: their request failed before going on."""
        self._rows = max(0, self._rows - len(lengths))
        self._work = max(0.0, self._work - self._read.cost.work_ns(lengths))

    def tickets(
        self, lengths: list[list[int]], deadlines: list[int | None], estimates: list[int]
    ) -> list[np.ndarray]:
        """The :data:`ISSUED_TICKET` tensor of each request passed on, numbered now.

        ``lengths``: each request's rows' token counts as tokenized (0 for an image);
        ``deadlines``, ``estimates`` (µs): each request's as admitted.
        """
        work = [self._read.cost.work_ns(rows) for rows in lengths]
        numbered = self.board.issue([len(rows) for rows in lengths], work)
        now = self.now_us()
        return [
            np.full(
                (len(rows), TICKET_WIDTH),
                (ticket, deadline or 0, now, estimate, work_ticket),
                dtype=np.int64,
            )
            for rows, (ticket, work_ticket), deadline, estimate in zip(
                lengths, numbered, deadlines, estimates, strict=True
            )
        ]

    def close(self) -> None:
        """Free this instance's slot on the board; log the refusals' total."""
        self.board.close()
        if self.refusals is not None:
            self.refusals.close()


def row_bytes(request: Any) -> list[int]:
    """The bytes of each row of ``request``'s ``BYTES`` inputs (rows of other inputs: 0)."""
    try:
        arrays = [tensor.as_numpy() for tensor in request.inputs()]
    except Exception:  # noqa: BLE001 - weighed as one row; reading it fails it properly
        return [0]
    rows = max([1, *(a.shape[0] for a in arrays if a.ndim)])
    sizes = [0] * rows
    for array in arrays:
        if array.dtype != np.object_ or not array.ndim or not array.size:
            continue
        for i, row in enumerate(array.reshape(array.shape[0], -1)):
            sizes[i] += sum(len(v) for v in row if isinstance(v, (bytes, str)))
    return sizes


def taken_ticket(tickets: Any) -> tuple[int, int | None, int, int, int]:
    """(row ticket, deadline µs or ``None``, admitted at µs, estimate µs, work ticket)."""
    if tickets is None or tickets.size < TICKET_WIDTH:
        return 0, None, 0, 0, 0
    ticket, deadline, admitted, estimate, work = (
        int(v) for v in tickets.reshape(-1, TICKET_WIDTH)[0]
    )
    return max(ticket, 0), (deadline if deadline > 0 else None), admitted, estimate, max(work, 0)


@dataclass(frozen=True)
class Taken:
    """What an admitted-to step takes in one execution: its requests' rows and tickets.

    ``lengths``: each request's rows' token counts (0 for rows without tokens), from
    which the execution's cost is priced and learned; ``ticket`` and ``work_ticket`` the
    highest tickets taken; ``estimated``: (admitted at µs, estimate µs) of each request
    admitted on an estimate of at least :data:`OBSERVED_FROM_US`.
    """

    lengths: tuple[tuple[int, ...], ...]
    ticket: int
    deadlines: tuple[int | None, ...]
    estimated: tuple[tuple[int, int], ...] = ()
    work_ticket: int = 0
    # (admitted at µs, estimate µs) of each request, (0, 0) for one without a ticket
    admitted: tuple[tuple[int, int], ...] = ()

    @property
    def rows(self) -> int:
        """The rows taken."""
        return sum(len(rows) for rows in self.lengths)

    def features(self) -> np.ndarray:
        """The execution's regressors (:func:`embed_runtime.ops.cost_model.features`)."""
        return features(self.lengths)

    def ratios(self, now_us: int) -> list[float]:
        """Each estimated request's wait so far over its estimate."""
        return [(now_us - admitted) / estimate for admitted, estimate in self.estimated]

    def residuals(self, now_us: int) -> list[int]:
        """What each short request's known-cost estimate left out, µs, at most 50 ms."""
        return [
            min(now_us - admitted - estimate, OBSERVED_FROM_US)
            for admitted, estimate in self.admitted
            if admitted > 0 and 0 < estimate < OBSERVED_FROM_US
        ]

    @classmethod
    def read(
        cls, pb_utils: Any, requests: list, input_name: str, mask_name: str = ""
    ) -> Taken:
        """Each request's :data:`ADMITTED_TICKET`; without one (a direct call), its rows.

        ``mask_name``: the input whose rows' sums are their token counts
        (``attention_mask``), where the step takes tokens. A request's deadline is the
        earlier of its ticket's and its :data:`DEADLINE_PARAMETER`.
        """
        lengths, high, high_work, deadlines, estimated, tickets = [], 0, 0, [], [], []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, ADMITTED_TICKET)
            ticket, deadline, work, admitted, estimate = 0, None, 0, 0, 0
            if tensor is not None:
                ticket, deadline, admitted, estimate, work = taken_ticket(tensor.as_numpy())
                if estimate >= OBSERVED_FROM_US and admitted > 0:
                    estimated.append((admitted, estimate))
            tickets.append((admitted, estimate))
            lengths.append(_row_lengths(pb_utils, request, input_name, mask_name))
            stated = deadline_us(_request_parameters(request))
            if stated is not None:
                deadline = stated if deadline is None else min(deadline, stated)
            high, high_work = max(high, ticket), max(high_work, work)
            deadlines.append(deadline)
        return cls(
            tuple(lengths), high, tuple(deadlines), tuple(estimated), high_work, tuple(tickets)
        )


def _row_lengths(pb_utils: Any, request: Any, input_name: str, mask_name: str) -> tuple:
    """Each row's token count (the sum of its mask), or 0s for the rows of ``input_name``."""
    if mask_name:
        mask = pb_utils.get_input_tensor_by_name(request, mask_name)
        if mask is not None:
            array = mask.as_numpy()
            if array.ndim == 2:
                return tuple(int(v) for v in array.sum(axis=1))
    data = pb_utils.get_input_tensor_by_name(request, input_name)
    rows = 0 if data is None else len(data.as_numpy())
    return (0,) * rows


def _request_parameters(request: Any) -> Mapping[str, Any]:
    try:
        parameters = json.loads(request.parameters())
    except (TypeError, ValueError):
        return {}
    return parameters if isinstance(parameters, dict) else {}


class LateError(UnavailableError):
    """The request's deadline passes before this execution can end; none of it was done."""


def late_refusals(taken: Taken, cost: Cost, now_us: Callable[[], int] = wall_clock_us):
    """Per request, the :class:`LateError` of one whose deadline passes before the run ends.

    The run is priced by the instance's own learned ``cost`` of the taken requests; an
    unknown cost (it has not run yet) refuses nothing.
    """
    if not cost.known:
        return [None] * len(taken.deadlines)
    end = now_us() + int(cost.of(taken.features()) / 1000)
    return [
        None
        if deadline is None or deadline >= end
        else LateError(
            f"server overloaded: the request's deadline passes {(end - deadline) / 1000:.0f} ms "
            "before this execution could end; retry later with backoff or a later deadline"
        )
        for deadline in taken.deadlines
    ]
