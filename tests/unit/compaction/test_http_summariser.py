"""The HTTP summariser against a real HTTP server on 127.0.0.1 (a thread of this process,
``tests.helpers.http.Server``).

Each test scripts the server's answers; the server records every request it gets, so
retries are counted, not inferred. Timeouts and backoff are set small through the
constructor.
"""

from __future__ import annotations

import json
import pickle
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pipeline.compaction.http import INSTRUCTIONS, HttpSummariser, endpoint_url
from pipeline.compaction.summaries import Detail, SummariserError, SummaryRequest, SummarySeed
from pipeline.errors import UsageError
from tests.helpers.http import Reply, Server


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def summariser(url: str, **kw: Any) -> HttpSummariser:
    options: dict[str, Any] = {"connect_timeout": 1.0, "read_timeout": 2.0, "retries": 2,
                               "backoff": 0.01, "backoff_max": 0.05, "retry_after_max": 5}
    options.update(kw)
    return HttpSummariser(url, "test-model", **options)


def cards() -> list[dict[str, Any]]:
    return [{"turn_id": f"turn-{n}", "asked": f"check service {n}",
             "did": [{"tool": "bash", "args_digest": {"cmd": "ls"}, "evidence_id": f"call_{n}"}],
             "answered": {"presentations": [], "narration": f"service {n} is healthy"},
             "outcome": "completed"} for n in (1, 2)]


def request(target: int = 256, seed: SummarySeed | None = None) -> SummaryRequest:
    return SummaryRequest("s", 1, 2, "turn-1", "turn-2", cards(), target, "gemma", seed)


def test_success_sends_an_openai_chat_request(server: Server,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VAKPIPE_SUMMARISER_API_KEY", "sk-test")
    s = summariser(server.base).summarise(request())
    assert s.text == Reply().text
    assert (s.summariser, s.version, s.detail) == ("http", "1:test-model", Detail.MODEL)
    assert s.tokens > 0 and not s.over_target and not s.seeded
    [seen] = server.seen
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["Authorization"] == "Bearer sk-test"
    assert seen.headers["Content-Type"] == "application/json"
    body = seen.body
    assert (body["model"], body["max_tokens"], body["temperature"]) == ("test-model", 256, 0)
    system, user = body["messages"]
    assert system == {"role": "system", "content": INSTRUCTIONS}
    assert user["role"] == "user"
    assert user["content"].startswith("Turns t1-t2 (2 turns). Token budget: 256.\n")
    sent = json.loads(user["content"].split("as JSON:\n", 1)[1])
    assert sent == [{"turn": 1, "card": cards()[0]}, {"turn": 2, "card": cards()[1]}]


def test_no_key_no_header_and_seed_sent_with_later_cards_only(server: Server,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    monkeypatch.delenv("VAKPIPE_SUMMARISER_API_KEY", raising=False)
    summariser(server.base).summarise(request(seed=SummarySeed("t1: all healthy.", "turn-1")))
    [seen] = server.seen
    assert "Authorization" not in seen.headers
    content = seen.body["messages"][1]["content"]
    assert "Earlier summary of turns t1 to t1 (keep it, then add the turns after it):\n" \
           "t1: all healthy.\n" in content
    sent = json.loads(content.split("as JSON:\n", 1)[1])
    assert [c["turn"] for c in sent] == [2]


def test_url_given_as_the_endpoint_is_used_as_is(server: Server) -> None:
    summariser(server.base + "/chat/completions/").summarise(request())
    assert server.seen[0].path == "/v1/chat/completions"
    assert endpoint_url("https://h:8/v1?api-version=2") == \
        "https://h:8/v1/chat/completions?api-version=2"
    assert endpoint_url("http://h") == "http://h/chat/completions"
    for bad in ("ftp://h/v1", "not a url", "http:///v1"):
        with pytest.raises(UsageError):
            HttpSummariser(bad, "m")
    with pytest.raises(UsageError) as err:  # the refusal does not print the password
        HttpSummariser("ftp://user:hunter2@h/v1", "m")
    assert "hunter2" not in str(err.value)


def test_503_then_success_is_retried_with_backoff(server: Server) -> None:
    server.replies = [Reply(503, b"busy"), Reply(503, b"busy"), Reply()]
    s = summariser(server.base, backoff=0.1, backoff_max=1.0).summarise(request())
    assert s.text == Reply().text
    assert len(server.seen) == 3
    first, second, third = (x.at for x in server.seen)
    # Exponential: 0.1 s before the first retry, 0.2 s before the second.
    assert second - first >= 0.09 and third - second >= 0.19


def test_retries_exhausted_name_the_status_and_attempts(server: Server) -> None:
    server.replies = [Reply(502, b"bad gateway upstream")]
    with pytest.raises(SummariserError, match=r"HTTP 502 \(after 3 attempts\): bad gateway"):
        summariser(server.base).summarise(request())
    assert len(server.seen) == 3


def test_429_honours_retry_after(server: Server) -> None:
    server.replies = [Reply(429, b"slow down", headers={"Retry-After": "1"}), Reply()]
    s = summariser(server.base, backoff=0.001).summarise(request())
    assert s.text == Reply().text
    assert len(server.seen) == 2
    assert server.seen[1].at - server.seen[0].at >= 0.95


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_other_4xx_is_not_retried(server: Server, status: int) -> None:
    server.replies = [Reply(status, b'{"error": {"message": "model not found"}}')]
    with pytest.raises(SummariserError) as info:
        summariser(server.base).summarise(request())
    message = str(info.value)
    assert f"summariser endpoint {server.base}/chat/completions" in message
    assert f"HTTP {status} (not retried)" in message and "model not found" in message
    assert len(server.seen) == 1


def test_timeout_is_an_error_after_its_retries(server: Server) -> None:
    # The reply comes after 1 s: were the read timeout not applied, the call would get
    # it and succeed, so the error itself shows each attempt gave up at the timeout.
    server.replies = [Reply(delay=1.0)]
    with pytest.raises(SummariserError, match=r"no answer within the read timeout \(0.2 s\)"):
        summariser(server.base, read_timeout=0.2, retries=1).summarise(request())
    assert len(server.seen) == 2


def test_connection_refused_is_an_error_naming_the_url() -> None:
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://user:secret@127.0.0.1:{port}/v1"
    with pytest.raises(SummariserError) as info:
        summariser(url, retries=1).summarise(request())
    message = str(info.value)
    assert f"summariser endpoint http://127.0.0.1:{port}/v1/chat/completions" in message
    assert "cannot connect: [Errno" in message and "(retries allowed: 1)" in message
    assert "secret" not in message


def test_connect_timeout_is_an_error() -> None:
    # A listener that never accepts, its backlog filled: Linux then drops the next SYN,
    # so connecting times out (all on 127.0.0.1).
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = [socket.socket() for _ in range(3)]
        try:
            for f in fillers:
                f.setblocking(False)
                f.connect_ex(("127.0.0.1", port))
            time.sleep(0.05)
            with pytest.raises(SummariserError, match=r"cannot connect within 0.2 s"):
                summariser(f"http://127.0.0.1:{port}", connect_timeout=0.2,
                           retries=1).summarise(request())
        finally:
            for f in fillers:
                f.close()


@pytest.mark.parametrize("body", [
    b"<html>not json</html>",
    b'{"choices": []}',
    b'{"error": "oops"}',
    b'{"choices": [{"message": {"content": null}}]}',
    b'{"choices": [{"message": {"content": "   "}}]}',
    b'[1, 2]',
])
def test_malformed_answers_are_errors(server: Server, body: bytes) -> None:
    server.replies = [Reply(body=body)]
    with pytest.raises(SummariserError, match=r"malformed answer|holds no summary"):
        summariser(server.base).summarise(request())
    assert len(server.seen) == 1


def test_cut_answer_and_over_target_are_flagged(server: Server) -> None:
    server.replies = [Reply(text="word " * 50, finish_reason="length")]
    s = summariser(server.base).summarise(request(target=10))
    assert s.detail is Detail.MODEL_CUT and s.over_target and s.tokens > 10


def test_pickles_before_and_after_use_without_the_key(server: Server,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VAKPIPE_SUMMARISER_API_KEY", "sk-very-secret")
    original = summariser(server.base)
    fresh = pickle.loads(pickle.dumps(original))
    assert fresh.summarise(request()).text == Reply().text
    original.summarise(request())  # the pool now exists
    data = pickle.dumps(original)
    assert b"sk-very-secret" not in data
    copy = pickle.loads(data)
    assert (copy.url, copy.version, repr(copy)) == (original.url, original.version,
                                                    repr(original))
    assert copy.summarise(request()).text == Reply().text
    assert len(server.seen) == 3
    assert all(s.headers["Authorization"] == "Bearer sk-very-secret" for s in server.seen)


def test_an_endless_answer_is_cut_at_the_limit_and_the_connection_dropped(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    import pipeline.compaction.http as http

    monkeypatch.setattr(http, "ANSWER_LIMIT", 1000)
    ok = Reply().payload()
    server.replies = [Reply(body=b"x" * 5000), Reply(body=ok), Reply(body=b"y" * 1000)]
    s = summariser(server.base)
    with pytest.raises(SummariserError, match=r"an answer larger than 0 MiB \(no summary is\)"):
        s.summarise(request())
    # The next request is answered whole, not from the bytes the first left unread.
    assert s.summarise(request()).text.startswith("Turns t1-t2")
    with pytest.raises(SummariserError, match="malformed answer"):  # at the limit: read
        s.summarise(request())
    assert len(server.seen) == 3
