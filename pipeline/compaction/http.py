"""A summariser that asks a model behind an OpenAI-compatible chat completions endpoint.

``POST <url>/chat/completions`` (or ``<url>`` itself when it already ends in
``/chat/completions``) with ``model``, ``messages`` (an instruction, then the range, the
seed and the turn cards as compact JSON), ``max_tokens`` = the token target and
``temperature`` 0. An API key, when the environment variable named by ``api_key_env``
holds one, goes in an ``Authorization: Bearer`` header; it is read at call time on the
worker, so it never travels inside a pickled summariser.

Retries (urllib3's :class:`~urllib3.util.Retry`): connection failures, timeouts and
answers 429 and 5xx, with exponential backoff (``backoff · 2^(n-1)`` seconds before retry
``n``, at most ``backoff_max``) or, on 429 and 503, the server's ``Retry-After`` (at most
``retry_after_max``); never another status. Every failure becomes one
:class:`~pipeline.compaction.summaries.SummariserError` naming the endpoint and the status or cause.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import orjson
import urllib3
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    MaxRetryError,
    NewConnectionError,
    ReadTimeoutError,
)
from urllib3.util import Retry, Timeout, parse_url

from pipeline.compaction.summaries import (
    Detail,
    SummariserError,
    Summary,
    SummaryRequest,
    compact_json,
    seed_prefix,
)
from pipeline.errors import UsageError
from pipeline.ledger.redact import redact, redact_value
from pipeline.replay.tokens import Tokenizer, get_tokenizer

#: Environment variable read for the API key by default.
API_KEY_ENV = "VAKPIPE_SUMMARISER_API_KEY"
#: Appended to a base URL (``http://host:8000/v1``) that does not already end in it.
ENDPOINT_PATH = "/chat/completions"
#: Statuses retried: rate limited, and every server error.
RETRY_STATUSES = frozenset({429, *range(500, 600)})
#: The most bytes of an answer read: a summary is a few thousand tokens, and an endpoint
#: that streams without end (a proxy's error page looping, a misrouted download) must
#: not fill a worker's memory.
ANSWER_LIMIT = 16 * 2**20
#: The system message: what a packet summary is for, and what it must keep.
INSTRUCTIONS = (
    "You compact the history of an AI agent's session. The user message lists a range "
    "of turns as turn cards (what the person asked, the tools the agent used with their "
    "evidence ids, what it answered, the outcome) and may give an earlier summary of the "
    "first turns of the range: keep what that summary says, then add the turns after it. "
    "Write one plain-text summary of the whole range, oldest first, that lets the agent "
    "carry on without the turns themselves: keep the goal, decisions, results, open "
    "questions, and every evidence id (ev:…) and presentation id (pres:…) a later turn "
    "may need. No preamble. Stay within the token budget given."
)


class _Backoff(Retry):
    """urllib3's Retry, except that the first retry waits too: an endpoint that answered
    429 or 503 is overloaded, and asking again at once only adds to its load."""

    def get_backoff_time(self) -> float:
        """``backoff_factor · 2^(n-1)`` before retry ``n``, at most ``backoff_max``."""
        if not self.history:
            return 0.0
        return float(min(self.backoff_max, self.backoff_factor * 2 ** (len(self.history) - 1)))


def endpoint_url(url: str) -> str:
    """The chat completions URL for ``url`` (a base URL, or the endpoint itself)."""
    try:
        parsed = parse_url(url)
    except ValueError as err:  # urllib3's LocationParseError is a ValueError
        raise UsageError(f"bad summariser URL {url!r}: {err}") from err
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise UsageError(f"bad summariser URL {_shown(url)!r}: http(s)://host[:port][/path] "
                         "expected")
    path = (parsed.path or "").rstrip("/")
    if not path.endswith(ENDPOINT_PATH):
        path += ENDPOINT_PATH
    return str(parsed._replace(path=path).url)


def _shown(url: str) -> str:
    """``url`` without credentials or query, for messages."""
    return str(parse_url(url)._replace(auth=None, query=None, fragment=None).url)


def _excerpt(data: bytes, limit: int = 300) -> str:
    # An error message may be printed or logged anywhere: what the endpoint echoed back
    # is redacted like transcript text.
    text = redact(" ".join(data.decode("utf-8", "replace").split()))
    return text if len(text) <= limit else text[:limit] + "…"


class HttpSummariser:
    """A :class:`~pipeline.compaction.summaries.Summariser` asking a model over HTTP.

    Picklable: the connection pool is made on first use in each process and never
    pickled.

    Parameters
    ----------
    url:
        Base URL (``http://host:8000/v1``) or the full ``…/chat/completions`` URL.
    model:
        The model to ask; part of :attr:`version`.
    api_key_env:
        Environment variable holding the API key (none sent when unset or ``None``).
    connect_timeout, read_timeout:
        Seconds to connect, and to wait for each read of the answer.
    retries:
        Retries after the first attempt.
    backoff, backoff_max, retry_after_max:
        Backoff factor and cap, and the longest ``Retry-After`` honoured (seconds).
    tokenizer:
        Counts the summary's tokens (default ``cl100k_base``).
    """

    def __init__(self, url: str, model: str, *, api_key_env: str | None = API_KEY_ENV,
                 connect_timeout: float = 10.0, read_timeout: float = 300.0,
                 retries: int = 4, backoff: float = 1.0, backoff_max: float = 30.0,
                 retry_after_max: int = 120, tokenizer: Tokenizer | None = None) -> None:
        if not model:
            raise UsageError("the http summariser needs a model name")
        if min(connect_timeout, read_timeout) <= 0 or retries < 0 \
                or min(backoff, backoff_max, retry_after_max) < 0:
            raise UsageError("timeouts must be positive; retries and backoff not negative")
        self.url = endpoint_url(url)
        self.model = model
        self.api_key_env = api_key_env
        self.timeout = Timeout(connect=connect_timeout, read=read_timeout)
        self.retries = retries
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.retry_after_max = retry_after_max
        self.tokenizer = tokenizer
        self._pool: urllib3.PoolManager | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """``http``."""
        return "http"

    @property
    def version(self) -> str:
        """``1:<model>``: the request format's version (bumped with any change to the body
        or :data:`INSTRUCTIONS`) and the model asked."""
        return f"1:{self.model}"

    def __repr__(self) -> str:
        return f"HttpSummariser({_shown(self.url)!r}, {self.model!r})"

    def __getstate__(self) -> dict[str, Any]:
        # A pool holds sockets and a lock holds a lock: neither pickles, and a worker
        # makes its own on first use anyway.
        state = self.__dict__.copy()
        state["_pool"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _http(self) -> urllib3.PoolManager:
        with self._lock:
            if self._pool is None:
                # Connections kept between requests, up to 8 per host: one for each
                # thread of a Dask worker that shares this summariser.
                self._pool = urllib3.PoolManager(maxsize=8)
            return self._pool

    def body(self, request: SummaryRequest) -> dict[str, Any]:
        """The JSON body sent for ``request``: the cards and the seed redacted, since a
        secret in a transcript must not leave for an endpoint either."""
        covered = seed_prefix(request)
        a, b = request.first_turn, request.last_turn
        lines = [f"Turns {request.span} ({b - a + 1} turn{'s' if b > a else ''}). "
                 f"Token budget: {request.target_tokens}."]
        first_new = 0
        if covered is not None and request.seed is not None:
            first_new = covered
            lines += [f"Earlier summary of turns t{a} to t{a + covered - 1} (keep it, then "
                      "add the turns after it):", redact(request.seed.summary.strip())]
        cards = [{"turn": a + i, "card": redact_value(card)}
                 for i, card in enumerate(request.cards) if i >= first_new]
        if cards:
            lines += ["Turn cards, oldest first, as JSON:", compact_json(cards)]
        return {"model": self.model,
                "messages": [{"role": "system", "content": INSTRUCTIONS},
                             {"role": "user", "content": "\n".join(lines)}],
                "max_tokens": request.target_tokens, "temperature": 0}

    def summarise(self, request: SummaryRequest) -> Summary:
        """Ask the endpoint for ``request``'s summary.

        Raises
        ------
        SummariserError
            The endpoint could not be reached, timed out, answered a status other than
            2xx (after the retries, for those retried), or answered without a summary.
        """
        where = f"summariser endpoint {_shown(self.url)}"
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        retry = _Backoff(total=self.retries, connect=self.retries, read=self.retries,
                         status=self.retries, other=0, redirect=0,
                         allowed_methods=frozenset({"POST"}), status_forcelist=RETRY_STATUSES,
                         backoff_factor=self.backoff, backoff_max=self.backoff_max,
                         retry_after_max=self.retry_after_max, raise_on_status=False,
                         raise_on_redirect=False)
        try:
            resp = self._http().request("POST", self.url, body=orjson.dumps(self.body(request)),
                                        headers=headers, timeout=self.timeout, retries=retry,
                                        redirect=False, preload_content=False)
            data = b""
            try:
                data = resp.read(ANSWER_LIMIT + 1)
            finally:  # read(n) stops short only at the end: a connection with an answer
                # left unread is closed, never put back in the pool
                if len(data) <= ANSWER_LIMIT:
                    resp.release_conn()
                else:
                    resp.close()
        except MaxRetryError as err:
            raise SummariserError(f"{where}: {self._cause(err.reason)} "
                                  f"(retries allowed: {self.retries})") from err
        except HTTPError as err:
            raise SummariserError(f"{where}: {self._cause(err)}") from err
        if not 200 <= resp.status < 300:
            history = resp.retries.history if resp.retries is not None else ()
            tried = (f"after {len(history) + 1} attempts" if resp.status in RETRY_STATUSES
                     else "not retried")
            raise SummariserError(f"{where}: HTTP {resp.status} ({tried}): "
                                  f"{_excerpt(data)}")
        if len(data) > ANSWER_LIMIT:
            raise SummariserError(f"{where}: an answer larger than {ANSWER_LIMIT >> 20} MiB "
                                  f"(no summary is): {_excerpt(data)}")
        return self._summary(data, where, request.target_tokens)

    def probe(self) -> None:
        """Check once, before any session is read, that the endpoint answers at all.

        One ``GET`` of the endpoint URL, not retried, within the connect timeout (and as
        long for the answer): any HTTP status but 401 and 403 (a chat endpoint answers a
        GET with 404 or 405) means a server is there; an unreachable host, a timeout or a
        refused key is the run's setup error, found in seconds rather than at the first
        packet, after a retried backoff on every worker.

        Raises
        ------
        SummariserError
            No server answers, or it refuses the credentials.
        """
        where = f"summariser endpoint {_shown(self.url)}"
        headers = {"Accept": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        wait = self.timeout.connect_timeout
        quick = Timeout(connect=wait, read=wait)
        try:
            resp = self._http().request("GET", self.url, headers=headers, timeout=quick,
                                        retries=False, redirect=False, preload_content=True)
        except HTTPError as err:
            self.timeout, before = quick, self.timeout
            try:
                cause = self._cause(err)
            finally:
                self.timeout = before
            raise SummariserError(f"{where}: {cause}") from err
        if resp.status in (401, 403):
            raise SummariserError(f"{where}: HTTP {resp.status}: the endpoint refused the "
                                  f"credentials (API key from ${self.api_key_env})")

    def _cause(self, err: Exception | None) -> str:
        if isinstance(err, ReadTimeoutError):
            return f"no answer within the read timeout ({self.timeout.read_timeout} s)"
        if isinstance(err, ConnectTimeoutError) and not isinstance(err, NewConnectionError):
            return f"cannot connect within {self.timeout.connect_timeout} s"
        if isinstance(err, NewConnectionError):
            # Its text repeats the host and port the message already names.
            return "cannot connect: " + str(err).split("new connection: ", 1)[-1]
        return str(err)

    def _summary(self, data: bytes, where: str, target: int) -> Summary:
        try:
            choice = orjson.loads(data)["choices"][0]
            text = choice["message"]["content"]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as err:
            raise SummariserError(f"{where}: malformed answer ({type(err).__name__}: {err}): "
                                  f"{_excerpt(data)}") from err
        if not isinstance(text, str) or not text.strip():
            raise SummariserError(f"{where}: the answer holds no summary: {_excerpt(data)}")
        # A model may still make up or echo a credential-shaped string: redacted too.
        text = redact(text.strip())
        tokens = (self.tokenizer or get_tokenizer()).count(text)
        detail = Detail.MODEL_CUT if choice.get("finish_reason") == "length" else Detail.MODEL
        return Summary(text, tokens, self.name, self.version, detail,
                       over_target=tokens > target)
