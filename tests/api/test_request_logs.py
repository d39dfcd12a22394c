"""One log line per request (memchat.logs), and never the request's content.

Each request logs one access record, "request", when its response has ended
(a streamed one included): method, route template, status, duration,
memchat's request id (never the client's), the verified user id, and the
client's own X-Request-ID as `client_request_id` when it is short and safe.
An unexpected error logs its type and place (and its frames at DEBUG),
never its message. Records are captured as memchat's logging set-up lets
them through (its own loggers at DEBUG, other libraries from WARNING), and
each is rendered as `memchat dev` and as Powertools would print it before
looking for the message, token and query.

Failures come from real failure paths: an unreachable database, a model
stream that breaks off, and an API connected as a role that cannot act for
users (`memchat_cleanup`, a wrong DATABASE_URL).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter

from memchat.logs import DevFormatter, RequestIdFilter
from tests.conftest import UNUSED_DATABASE, make_settings
from tests.handlers import conftest as lambda_fixtures
from tests.handlers.conftest import LambdaRuntime, body_of, http_event, token_for
from tests.utils.analytics_data import empty_database
from tests.utils.api import ApiClient
from tests.utils.chat_api import assert_error
from tests.utils.fake_openai import FakeOpenAI
from tests.utils.logs import assert_not_logged, rendered
from tests.utils.sse import parse, serve
from tests.utils.users import UserFactory

# The Lambda runtime of tests/handlers, for the JSON line as deployed.
lambda_ = lambda_fixtures.lambda_
lambda_env = lambda_fixtures.lambda_env

SECRET = "my locker code is tangerine"
STREAM = {"Accept": "text/event-stream"}
FIELDS = {"method", "route", "status", "duration_ms", "request_id", "user_id"}


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """memchat's records from DEBUG, everything else from WARNING, each
    stamped with the request it was logged in (as memchat's handlers are)."""
    caplog.set_level(logging.DEBUG, logger="memchat")
    stamp = RequestIdFilter()
    caplog.handler.addFilter(stamp)
    yield caplog
    caplog.handler.removeFilter(stamp)


def access(caplog: pytest.LogCaptureFixture, request_id: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.getMessage() == "request" and getattr(r, "request_id", None) == request_id
    ]


def only_access(caplog: pytest.LogCaptureFixture, request_id: str) -> logging.LogRecord:
    (record,) = access(caplog, request_id)
    assert set(record.__dict__) >= FIELDS
    assert isinstance(record.duration_ms, float) and record.duration_ms > 0
    assert record.name == "memchat.api" and record.levelno == logging.INFO
    return record


def assert_never_logged(caplog: pytest.LogCaptureFixture, *texts: str) -> None:
    assert caplog.records
    assert_not_logged(caplog, *texts)


# ------------------------------------------------------------------- 2xx


async def test_a_json_turn_logs_one_line_with_its_route_user_and_duration(
    api: ApiClient, model: FakeOpenAI, logs: pytest.LogCaptureFixture
) -> None:
    user_id, auth = api.new_user()
    r = await api.post(
        "/chat", json={"message": SECRET}, headers={**auth, "X-Request-ID": "req-json"}
    )
    assert r.status_code == 200, r.text

    record = only_access(logs, r.headers["x-request-id"])
    assert (record.method, record.route, record.status) == ("POST", "/chat", 200)
    assert record.user_id == str(user_id)
    # The client's own id is a field of its own, beside memchat's.
    assert record.request_id != "req-json" and record.client_request_id == "req-json"
    # Records logged during the request carry its id too (the turn's own line).
    turn = [r for r in logs.records if r.getMessage() == "chat turn stored"]
    assert turn and turn[0].request_id == record.request_id
    token = auth["Authorization"].removeprefix("Bearer ")
    assert_never_logged(logs, SECRET, "tangerine", token, "Bearer")
    line = DevFormatter().format(record)
    assert line.endswith(
        f"POST /chat 200 {record.duration_ms:.1f} ms req={record.request_id} user={user_id}"
        " client_req=req-json"
    )


async def test_the_route_is_the_template_never_the_path_or_query(
    api: ApiClient, model: FakeOpenAI, logs: pytest.LogCaptureFixture
) -> None:
    user_id, auth = api.new_user()
    turn = (await api.post("/chat", json={"message": SECRET}, headers=auth)).json()
    session_id = turn["session_id"]
    r = await api.get(
        f"/chat/export/{session_id}",
        params={"format": "markdown"},
        headers={**auth, "X-Request-ID": "req-export"},
    )
    assert r.status_code == 200, r.text
    assert SECRET in r.text  # the export has it; the log must not

    record = only_access(logs, r.headers["x-request-id"])
    assert (record.method, record.route, record.status) == (
        "GET",
        "/chat/export/{session_id}",
        200,
    )
    assert record.user_id == str(user_id)
    assert session_id not in rendered(record)  # an id, not secret, but not the route
    assert_never_logged(logs, SECRET, "markdown", "format=")


# ---------------------------------------------------------------- stream


async def test_a_streamed_turn_logs_its_line_when_the_stream_ends(
    api: ApiClient, model: FakeOpenAI, logs: pytest.LogCaptureFixture
) -> None:
    user_id, auth = api.new_user()
    model.script({"content": "one two three four five six", "chunk_delay": 0.1})
    async with serve(api.app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        headers = {**auth, **STREAM, "X-Request-ID": "req-stream"}
        async with client.stream("POST", "/chat", json={"message": SECRET}, headers=headers) as r:
            assert r.status_code == 200
            request_id = r.headers["x-request-id"]
            chunks = r.aiter_text()
            seen = ""
            while "event: delta" not in seen:
                seen += await anext(chunks)
            # The answer is still being written: no line yet.
            assert access(logs, request_id) == []
            async for chunk in chunks:
                seen += chunk
        assert [e.name for e in parse(seen)][-1] == "done"
        deadline = time.monotonic() + 5
        while not access(logs, request_id) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    record = only_access(logs, request_id)
    assert (record.method, record.route, record.status) == ("POST", "/chat", 200)
    assert record.user_id == str(user_id)
    assert record.duration_ms >= 500  # the whole stream: five pauses of 0.1 s
    assert_never_logged(logs, SECRET, "tangerine", "three four", auth["Authorization"])


async def test_a_model_failure_mid_stream_is_a_200_line_and_no_content(
    api: ApiClient, model: FakeOpenAI, logs: pytest.LogCaptureFixture
) -> None:
    """The stream had started (200): the error is an event, the line says 200."""
    _, auth = api.new_user()
    model.script({"content": "partial answer here", "fail_after": 1})
    r = await api.post(
        "/chat", json={"message": SECRET}, headers={**auth, **STREAM, "X-Request-ID": "req-mid"}
    )
    assert [e.name for e in parse(r.text)][-1] == "error"
    record = only_access(logs, r.headers["x-request-id"])
    assert (record.route, record.status) == ("/chat", 200)
    assert_never_logged(logs, SECRET, "partial answer")


# ------------------------------------------------------------------- 4xx


async def test_a_refused_token_is_logged_without_a_user_or_the_token(
    api: ApiClient, logs: pytest.LogCaptureFixture
) -> None:
    forged = api.token_for(uuid.uuid4()) + "x"
    r = await api.get(
        "/memory", headers={"Authorization": f"Bearer {forged}", "X-Request-ID": "req-401"}
    )
    assert_error(r, 401, "unauthorized")
    record = only_access(logs, r.headers["x-request-id"])
    assert (record.method, record.route, record.status, record.user_id) == (
        "GET",
        "/memory",
        401,
        None,
    )
    assert "user=-" in DevFormatter().format(record)
    assert_never_logged(logs, forged, forged.split(".")[1])


async def test_a_validation_error_names_the_user_but_not_the_message(
    api: ApiClient, model: FakeOpenAI, logs: pytest.LogCaptureFixture
) -> None:
    user_id, auth = api.new_user()
    r = await api.post(
        "/chat",
        json={"message": SECRET, "max_history_messages": "lots"},
        headers={**auth, "X-Request-ID": "req-422"},
    )
    assert_error(r, 422, "validation_error")
    record = only_access(logs, r.headers["x-request-id"])
    assert (record.route, record.status, record.user_id) == ("/chat", 422, str(user_id))
    assert model.calls == 0
    assert_never_logged(logs, SECRET, "lots")


async def test_an_unknown_path_logs_no_path_and_no_query(
    api: ApiClient, logs: pytest.LogCaptureFixture
) -> None:
    r = await api.get(
        "/secret-place/tangerine",
        params={"token": "sekrit-value"},
        headers={"X-Request-ID": "r404"},
    )
    assert_error(r, 404, "not_found")
    record = only_access(logs, r.headers["x-request-id"])
    assert (record.method, record.route, record.status) == ("GET", "(unmatched)", 404)
    assert_never_logged(logs, "secret-place", "tangerine", "sekrit-value")


async def test_a_body_refused_before_routing_still_names_its_route(
    api: ApiClient, logs: pytest.LogCaptureFixture
) -> None:
    _, auth = api.new_user()
    body = json.dumps({"message": SECRET + " " + "x" * 1_000_001})
    r = await api.post(
        "/chat",
        content=body,
        headers={**auth, "Content-Type": "application/json", "X-Request-ID": "req-413"},
    )
    assert_error(r, 413, "payload_too_large")
    record = only_access(logs, r.headers["x-request-id"])
    assert (record.route, record.status) == ("/chat", 413)
    assert_never_logged(logs, SECRET)


async def test_a_wrong_method_is_logged_with_the_route_it_missed(
    api: ApiClient, logs: pytest.LogCaptureFixture
) -> None:
    r = await api.patch("/memory", headers={"X-Request-ID": "req-405"})
    assert_error(r, 405, "method_not_allowed")
    record = only_access(logs, r.headers["x-request-id"])
    assert (record.method, record.route, record.status) == ("PATCH", "/memory", 405)


# ------------------------------------------------------------ request ids

FORGED_IDS = [
    # A fake second access line, after a newline.
    'x\n{"level":"INFO","message":"request","status":200,"user_id":"forged-victim"}',
    # Fake fields on the same line (printable: the old check let it through).
    '{"message": "request", "user_id": "forged-victim"}',
    "req-1 user=forged-victim",
    "forged-victim\r\nX-Injected: 1",
    "forged-victim-" + "x" * 51,  # 65 characters: one too many
    "forged-victim-é",
]


@pytest.mark.parametrize("forged", FORGED_IDS, ids=range(len(FORGED_IDS)))
async def test_a_forged_request_id_is_never_memchats_and_never_logged(
    api: ApiClient, logs: pytest.LogCaptureFixture, forged: str
) -> None:
    """Attacks log forging through X-Request-ID: a client's id with newlines,
    fake JSON or fake fields, or one too long, is neither the request_id
    (of the error JSON, the response header or any log record) nor logged
    anywhere, in any form a record is printed."""
    _, auth = api.new_user()
    for headers, status, code in (({}, 401, "unauthorized"), (auth, 422, "validation_error")):
        sent = {**headers, "X-Request-ID": forged.encode()}  # bytes: UTF-8 as sent
        r = await api.get("/sessions?limit=0", headers=sent)
        body = assert_error(r, status, code)
        request_id = body["request_id"]
        assert re.fullmatch("[0-9a-f]{32}", request_id)  # memchat's own
        record = only_access(logs, request_id)
        assert not hasattr(record, "client_request_id")
    assert all(getattr(r, "request_id", None) != forged for r in logs.records)
    assert_never_logged(logs, forged, "forged-victim", "X-Injected")


async def test_a_safe_client_id_is_logged_beside_memchats_and_cannot_take_its_place(
    api: ApiClient, logs: pytest.LogCaptureFixture
) -> None:
    """A client id up to 64 characters of [A-Za-z0-9._:-] is logged as
    `client_request_id`; even one naming another request's id does not
    become this request's id, so no line can pose as another request's."""
    first = await api.get("/health")
    other_id = first.headers["x-request-id"]
    safe = "web:7.a_b-" + "c" * 54  # 64 characters
    for client_id in (safe, other_id):
        r = await api.get("/health", headers={"X-Request-ID": client_id})
        assert r.status_code == 200
        request_id = r.headers["x-request-id"]
        assert request_id not in (client_id, other_id)
        record = only_access(logs, request_id)
        assert record.client_request_id == client_id
        assert (
            DevFormatter()
            .format(record)
            .endswith(f"req={request_id} user=- client_req={client_id}")
        )
        assert json.loads(LambdaPowertoolsFormatter().format(record))["client_request_id"] == (
            client_id
        )
    assert len(access(logs, other_id)) == 1  # the first request's line only


# ------------------------------------------------------------------- 5xx


async def test_an_unreachable_database_is_a_503_line_with_its_request_id(
    model: FakeOpenAI, logs: pytest.LogCaptureFixture
) -> None:
    api = ApiClient(make_settings(UNUSED_DATABASE, model.url))
    try:
        _, auth = api.new_user()
        r = await api.post("/chat", json={"message": SECRET}, headers=auth)
    finally:
        await api.aclose()
    body = assert_error(r, 503, "database_unavailable")
    record = only_access(logs, body["request_id"])
    assert (record.route, record.status) == ("/chat", 503)
    (failed,) = [r for r in logs.records if r.getMessage() == "request failed"]
    assert failed.request_id == body["request_id"] and failed.error == "database_unavailable"
    assert_never_logged(logs, SECRET, "127.0.0.1:1", auth["Authorization"])


@pytest.fixture(scope="module")
def unmigrated(admin: psycopg.Connection, admin_url: str) -> Iterator[str]:
    """A database without memchat's schema (a DATABASE_URL pointing at the
    wrong database): every request fails in a way nothing expects."""
    with empty_database(admin, admin_url, "memchat_unmigrated") as url:
        yield url


async def _unmigrated(
    unmigrated: str, model: FakeOpenAI, url: str
) -> tuple[httpx.Response, str, str]:
    """`url` on an API connected to a database without memchat's schema."""
    api = ApiClient(make_settings(unmigrated, model.url))
    try:
        user_id, auth = api.new_user()
        r = await api.get(url, headers=auth)
    finally:
        await api.aclose()
    return r, str(user_id), auth["Authorization"]


def _unexpected(caplog: pytest.LogCaptureFixture, request_id: str) -> logging.LogRecord:
    (record,) = [r for r in caplog.records if r.getMessage() == "unhandled error"]
    assert record.levelno == logging.ERROR and record.request_id == request_id
    assert record.error_type == "psycopg.errors.InvalidSchemaName"
    assert record.error_module.startswith("psycopg")
    assert isinstance(record.error_line, int) and record.error_line > 0
    assert record.app_frame.startswith("memchat.")
    assert not record.exc_info
    return record


@pytest.mark.parametrize(
    ("url", "route"),
    [("/memory?agent_name=planner", "/memory"), ("/export?format=ndjson", "/export")],
    ids=["json", "streamed-export"],
)
async def test_an_unexpected_error_logs_type_and_place_and_the_client_gets_its_id(
    unmigrated: str, model: FakeOpenAI, logs: pytest.LogCaptureFixture, url: str, route: str
) -> None:
    logs.set_level(logging.INFO, logger="memchat")
    r, user_id, authorization = await _unmigrated(unmigrated, model, url)

    body = assert_error(r, 500, "internal_error")
    error = _unexpected(logs, body["request_id"])
    assert not hasattr(error, "traceback")  # frames only at DEBUG
    record = only_access(logs, body["request_id"])
    assert (record.route, record.status, record.user_id) == (route, 500, user_id)
    line = DevFormatter().format(error)
    assert f"psycopg.errors.InvalidSchemaName at {error.error_module}:" in line
    assert line.endswith(f"req={body['request_id']}")
    # The exception's own text is never logged (another error's could quote input).
    assert_never_logged(logs, authorization, "does not exist", "planner", "ndjson")


async def test_at_debug_an_unexpected_error_logs_its_frames_not_its_message(
    unmigrated: str, model: FakeOpenAI, logs: pytest.LogCaptureFixture
) -> None:
    r, _, authorization = await _unmigrated(unmigrated, model, "/memory")

    body = assert_error(r, 500, "internal_error")
    error = _unexpected(logs, body["request_id"])
    frames = error.traceback
    assert frames.startswith("Traceback (most recent call last):")
    # The store's frame: the transaction's claims or, pipelined, the first read.
    assert re.search(r'memchat/store/(db|notes)\.py", line \d+', frames)
    assert frames.endswith("psycopg.errors.InvalidSchemaName (message not logged)")
    assert frames in DevFormatter().format(error)
    assert_never_logged(logs, authorization, "does not exist")


async def test_an_api_logged_in_as_another_role_is_a_logged_500(
    cleanup_url: str, model: FakeOpenAI, logs: pytest.LogCaptureFixture
) -> None:
    """A wrong DATABASE_URL (the cleanup's login): the database refuses to act
    for the user. A 500 whose log line names what was refused (PostgreSQL's
    permission errors name roles and tables, never values), not a 404."""
    logs.set_level(logging.INFO, logger="memchat")
    api = ApiClient(make_settings(cleanup_url, model.url))
    try:
        _, auth = api.new_user()
        r = await api.get("/memory?agent_name=planner", headers=auth)
    finally:
        await api.aclose()

    body = assert_error(r, 500, "internal_error")
    (refused,) = [m for m in logs.records if m.getMessage().startswith("database permission")]
    assert refused.db_error == 'permission denied to set role "memchat_user"'
    assert only_access(logs, body["request_id"]).status == 500
    assert_never_logged(logs, auth["Authorization"], "planner")


# -------------------------------------------------------- deployed: JSON


def test_deployed_the_line_is_powertools_json_correlated_by_the_gateway_request_id(
    lambda_: LambdaRuntime, users: UserFactory, model: FakeOpenAI
) -> None:
    caller = users.create()
    token = token_for(caller.user_id)
    event = http_event("chat.json", token=token, body={"message": SECRET})
    gateway_id = event["requestContext"]["requestId"]

    response = lambda_.invoke("chat", event)

    assert response["statusCode"] == 200, response
    assert body_of(response)["answer"] == f"echo: {SECRET}"
    lines: list[dict[str, Any]] = lambda_.log_records()
    (line,) = [r for r in lines if r["message"] == "request"]
    assert line["level"] == "INFO" and line["service"] == "memchat"
    assert line["correlation_id"] == line["request_id"] == gateway_id
    assert (line["method"], line["route"], line["status"]) == ("POST", "/chat", 200)
    assert line["user_id"] == str(caller.user_id) and line["duration_ms"] > 0
    assert line["function_name"] and line["cold_start"] is True
    # Every line of the invocation is correlated; none has the message or token.
    assert all(r["correlation_id"] == gateway_id for r in lines)
    text = lambda_.logs.getvalue()
    assert SECRET not in text and "tangerine" not in text and token not in text
