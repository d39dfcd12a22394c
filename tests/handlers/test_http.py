"""The API Gateway functions (chat, clear) invoked with API Gateway v2 events.

The export function is not behind API Gateway: see test_stream.py.
"""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any

import pytest

from tests.handlers.conftest import (
    FakeContext,
    LambdaRuntime,
    body_of,
    http_event,
    route_event,
    token_for,
)
from tests.utils.users import UserFactory

SECRET_MESSAGE = "my locker code is tangerine, remember that"


def emf_records(out: str) -> list[dict[str, Any]]:
    """The CloudWatch embedded-metric-format lines Powertools printed."""
    records = []
    for line in out.splitlines():
        if line.startswith("{") and '"_aws"' in line:
            records.append(json.loads(line))
    return records


def metric_names(record: dict[str, Any]) -> set[str]:
    return {m["Name"] for d in record["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]}


def chat(runtime: LambdaRuntime, token: str, message: str, **body: Any) -> dict[str, Any]:
    event = http_event("chat.json", token=token, body={"message": message, **body})
    response = runtime.invoke("chat", event)
    assert response["statusCode"] == 200, response
    return body_of(response)


def test_chat_cold_then_warm_reuses_the_connection(
    lambda_: LambdaRuntime, users: UserFactory, model, capsys
) -> None:
    caller = users.create()
    token = token_for(caller.user_id)
    session_id = str(uuid.uuid4())
    event = http_event(
        "chat.json", token=token, body={"message": SECRET_MESSAGE, "session_id": session_id}
    )

    response = lambda_.invoke("chat", event)

    assert response["statusCode"] == 200, response
    assert response["isBase64Encoded"] is False
    headers = response["headers"]
    assert headers["content-type"] == "application/json"
    assert headers["x-session-id"] == session_id
    assert headers["x-request-id"] == event["requestContext"]["requestId"]
    body = body_of(response)
    assert body["answer"] == f"echo: {SECRET_MESSAGE}"
    assert body["session_id"] == session_id
    assert body["memory"]["enabled"] is True
    assert body["session"]["message_count"] == 2
    assert model.calls == 1

    http = lambda_.load("http")
    db = http.app.state.memchat.db
    ((first_conn, _),) = db._idle

    follow_up = chat(lambda_, token, "what did I just tell you?", session_id=session_id)
    assert follow_up["memory"]["messages_in_context"] == 2
    assert SECRET_MESSAGE in json.dumps(model.requests[-1]["messages"])
    ((second_conn, _),) = db._idle
    assert second_conn is first_conn  # warm invocation: same connection

    out = capsys.readouterr().out
    metrics = emf_records(out)
    cold = [m for m in metrics if "ColdStart" in m]
    assert len(cold) == 1 and cold[0]["function_name"] == FakeContext().function_name
    requests = [m for m in metrics if "RequestLatency" in m]
    assert [m["route"] for m in requests] == ["POST /chat", "POST /chat"]
    assert all(m["Http5xx"] == [0.0] and m["Requests"] == [1.0] for m in requests)
    assert all(r["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "memchat" for r in metrics)

    # Logs: JSON, correlated by API Gateway's request id, never the message or token.
    logs = lambda_.log_records()
    request_logs = [r for r in logs if r.get("message") == "request"]
    assert request_logs[0]["correlation_id"] == event["requestContext"]["requestId"]
    assert all(r["service"] == "memchat" and r["function_name"] for r in request_logs)
    everything = lambda_.logs.getvalue() + out
    assert "tangerine" not in everything and "locker" not in everything
    assert token not in everything and "Bearer" not in everything


def test_base64_encoded_request_body(lambda_: LambdaRuntime, users: UserFactory, model) -> None:
    token = token_for(users.create().user_id)
    event = http_event("chat.json", token=token, body={"message": "héllo"}, base64_body=True)
    response = lambda_.invoke("chat", event)
    assert response["statusCode"] == 200, response
    assert body_of(response)["answer"] == "echo: héllo"


def test_chat_needs_a_token(lambda_: LambdaRuntime, model) -> None:
    event = http_event("chat.json", body={"message": "hi"})
    response = lambda_.invoke("chat", event)
    assert response["statusCode"] == 401
    assert response["headers"]["www-authenticate"] == "Bearer"
    body = body_of(response)
    assert body["error"] == "unauthorized"
    assert body["request_id"] == event["requestContext"]["requestId"]
    assert model.calls == 0


@pytest.mark.parametrize(
    ("client_id", "logged"),
    [
        ("web-7:retry.2", True),
        ('x","request_id":"forged-id","user_id":"forged-user', False),
        ("forged-id\nforged line", False),
    ],
    ids=["safe", "fake-json", "newline"],
)
def test_the_gateway_request_id_is_memchats_whatever_the_client_sends(
    lambda_: LambdaRuntime, model, client_id: str, logged: bool
) -> None:
    """Attacks log forging behind API Gateway: the client's X-Request-ID is
    never the request id (error JSON, header, correlation id); a safe one is
    logged as client_request_id on the access line, any other nowhere."""
    event = http_event("chat.json", body={"message": "hi"})
    event["headers"]["x-request-id"] = client_id
    gateway_id = event["requestContext"]["requestId"]

    response = lambda_.invoke("chat", event)

    assert response["statusCode"] == 401
    assert response["headers"]["x-request-id"] == body_of(response)["request_id"] == gateway_id
    lines = lambda_.log_records()
    (line,) = [r for r in lines if r.get("message") == "request"]
    assert line["request_id"] == line["correlation_id"] == gateway_id
    assert all(r.get("correlation_id") in (None, gateway_id) for r in lines)
    if logged:
        assert line["client_request_id"] == client_id
    else:
        assert "client_request_id" not in line
        assert "forged" not in lambda_.logs.getvalue()


def test_clear_session(lambda_: LambdaRuntime, users: UserFactory, model) -> None:
    token = token_for(users.create().user_id)
    session_id = chat(lambda_, token, "hello")["session_id"]

    event = http_event(
        "clear_session.json", token=token, body={"session_id": session_id, "agent_name": "default"}
    )
    response = lambda_.invoke("clear", event, FakeContext(function_name="memchat-Sessions"))

    assert response["statusCode"] == 200, response
    assert response["isBase64Encoded"] is False
    cleared = body_of(response)
    assert cleared["cleared_session_id"] == session_id
    assert cleared["deleted_messages"] == 2
    assert uuid.UUID(cleared["new_session_id"]) != uuid.UUID(session_id)


def test_sessions_memory_and_account_routes(
    lambda_: LambdaRuntime, users: UserFactory, model
) -> None:
    token = token_for(users.create().user_id)
    session_id = chat(lambda_, token, "hi")["session_id"]

    def call(event: dict[str, Any]) -> dict[str, Any]:
        response = lambda_.invoke("clear", event, FakeContext(function_name="memchat-Sessions"))
        assert response["isBase64Encoded"] is False
        return response

    response = call(http_event("sessions.json", token=token, query={"agent_name": "default"}))
    assert response["statusCode"] == 200, response
    assert [s["id"] for s in body_of(response)["sessions"]] == [session_id]

    response = call(route_event("GET", "/sessions/active", "/sessions/active", token=token))
    assert response["statusCode"] == 200, response
    assert body_of(response)["id"] == session_id

    notes = "# About the user\n- Name: Ada\n"
    response = call(
        http_event("memory_put.json", token=token, body={"agent_name": "default", "notes": notes})
    )
    assert response["statusCode"] == 200, response
    response = call(route_event("GET", "/memory", "/memory", token=token))
    assert response["statusCode"] == 200 and body_of(response)["notes"] == notes
    response = call(route_event("DELETE", "/memory", "/memory", token=token))
    deleted = {"deleted": 1, "versions_deleted": 1}
    assert response["statusCode"] == 200 and body_of(response) == deleted, response

    response = call(route_event("DELETE", "/me", "/me", token=token))
    assert response["statusCode"] == 200, response
    response = call(route_event("GET", "/sessions", "/sessions", token=token))
    assert response["statusCode"] == 200 and body_of(response)["sessions"] == []


def test_health(lambda_: LambdaRuntime, capsys) -> None:
    event = http_event("health.json")
    response = lambda_.invoke("clear", event, FakeContext(function_name="memchat-Sessions"))
    assert response["statusCode"] == 200
    assert body_of(response) == {"status": "ok", "database": "ok"}
    (request,) = [m for m in emf_records(capsys.readouterr().out) if "RequestLatency" in m]
    assert request["route"] == "GET /health"


def test_unknown_route_is_a_json_404(lambda_: LambdaRuntime) -> None:
    event = route_event("GET", "/nope", "/nope")
    response = lambda_.invoke("chat", event)
    assert response["statusCode"] == 404
    assert body_of(response)["error"] == "not_found"


def test_secrets_are_fetched_before_the_app_is_built(
    lambda_: LambdaRuntime, lambda_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from memchat import secrets

    arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:memchat/database-url-AbCdEf"
    fetched: list[str] = []

    def fake_get_secret(name: str) -> str:
        fetched.append(name)
        return json.dumps({"DATABASE_URL": lambda_env["DATABASE_URL"]})

    monkeypatch.setattr(secrets, "_fetch_secret", fake_get_secret)
    monkeypatch.delenv("DATABASE_URL")
    monkeypatch.setenv("DATABASE_URL_SECRET_ARN", arn)

    response = lambda_.invoke("clear", http_event("health.json"))

    assert fetched == [arn]
    assert response["statusCode"] == 200
    settings = lambda_.load("http").app.state.memchat.settings
    assert settings.database_url == lambda_env["DATABASE_URL"]


def test_a_missing_setting_fails_the_init_phase_by_name(
    lambda_: LambdaRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memchat.config import ConfigError

    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        lambda_.load("chat")


def test_turn_metrics_through_the_chat_hook(
    lambda_: LambdaRuntime, users: UserFactory, model, capsys
) -> None:
    http = lambda_.load("http")
    assert http.app.state.memchat.chat.on_turn is sys.modules["memchat.observability"].record_turn
    token = token_for(users.create().user_id)
    chat(lambda_, token, "count my tokens")
    (request,) = [m for m in emf_records(capsys.readouterr().out) if "RequestLatency" in m]
    assert request["PromptTokens"] == [11.0] and request["CompletionTokens"] == [7.0]
    assert "MemoryRetrievalLatency" in request and "TurnLatency" in request
