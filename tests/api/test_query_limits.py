"""The query string is checked first: at most MAX_QUERY_PARAMETERS
parameters (400 `too_many_query_parameters`), none repeated (422), before
routing, authentication or reading the body, in linear time.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from memchat.api.deps import MAX_QUERY_PARAMETERS
from tests.utils.api import ApiClient
from tests.utils.chat_api import assert_error


def _query(count: int) -> str:
    return "&".join(f"p{i}=v" for i in range(count))


async def _call(app: Any, method: str, path: str, query: str) -> tuple[int, bool]:
    """One request straight through the ASGI app with a body (as a server
    would pass it): its status, and whether the app asked for the body."""
    body = b'{"message": "hi"}'
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"17")],
        "client": ("127.0.0.1", 1),
        "server": ("memchat.test", 80),
    }
    read = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal read
        read = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status, read


async def test_ten_thousand_parameters_are_a_400_before_authentication_or_the_body(
    api: ApiClient,
) -> None:
    """Attacks the check's place and cost: 10,000 distinct parameters on a
    POST without a token were checked pairwise (seconds of CPU) before the
    401; now they are refused first, and the body is never read."""
    assert await _call(api.app, "POST", "/chat", _query(10_000)) == (400, False)

    r = await api.get(f"/sessions?{_query(1_000)}")  # httpx sends up to 64 KB of URL
    body = assert_error(r, 400, "too_many_query_parameters")
    assert f"more than {MAX_QUERY_PARAMETERS} parameters" in body["detail"]


async def test_the_cap_counts_parameters_not_empty_fields(api: ApiClient) -> None:
    """At the cap a request is served; one more is refused; the empty fields
    of `&&` are no parameters (Starlette drops them too)."""
    assert MAX_QUERY_PARAMETERS >= 10  # every endpoint takes three at most
    r = await api.get(f"/health?{_query(MAX_QUERY_PARAMETERS)}")
    assert r.status_code == 200, r.text
    r = await api.get(f"/health?{_query(MAX_QUERY_PARAMETERS)}&{'&' * 100}")
    assert r.status_code == 200, r.text
    r = await api.get(f"/health?{_query(MAX_QUERY_PARAMETERS + 1)}")
    assert_error(r, 400, "too_many_query_parameters")


@pytest.mark.parametrize(
    "url",
    [
        "/sessions?limit=5&%6Cimit=500",  # the names the route sees, decoded
        "/memory?agent+name=a&agent%20name=b",
    ],
)
async def test_a_repeated_parameter_is_found_as_the_routes_read_names(
    api: ApiClient, url: str
) -> None:
    """Attacks the new parse: a name repeated in another spelling is still
    repeated, and is refused before the token is looked at."""
    body = assert_error(await api.get(url), 422, "validation_error")
    assert "give each query parameter once" in body["detail"]


def _python_calls(run: Callable[[], object]) -> int:
    """How many Python function calls `run` makes (C work is not counted)."""
    calls = 0

    def tracer(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        calls += 1

    sys.setprofile(tracer)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


async def test_refusing_parameters_costs_the_same_at_any_count(api: ApiClient) -> None:
    """Attacks the check's linear bound: refusing 200 or 2,000 parameters
    takes the same number of Python calls (nothing is done per parameter),
    where a pairwise check makes 100 times more at 2,000. Counted, not timed."""
    # First calls build the middleware stack and fill caches: not counted.
    await _call(api.app, "GET", "/sessions", _query(2))
    await _call(api.app, "GET", "/sessions", _query(MAX_QUERY_PARAMETERS + 1))

    def refusal(count: int) -> Callable[[], object]:
        query = _query(count)

        def run() -> object:
            coroutine = _call(api.app, "GET", "/sessions", query)
            try:
                coroutine.send(None)  # nothing in a refusal waits
            except StopIteration as done:
                return done.value
            raise AssertionError("the refusal waited for something")

        return run

    small, large = _python_calls(refusal(200)), _python_calls(refusal(2_000))
    assert small == large
