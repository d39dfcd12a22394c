"""/openapi.json says what the API does: UUID formats, the bearer scheme,
every status an endpoint can answer (with the error schema), and the allowed
methods of each path; checked against the schema and by calling the endpoints.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from memchat.api.middleware import MAX_BODY_BYTES
from memchat.api.routes import imports
from tests.conftest import make_settings
from tests.utils.api import ApiClient
from tests.utils.chat_api import assert_error, chat
from tests.utils.fake_openai import FakeOpenAI
from tests.utils.openai_api import OPENAI_PREFIX, assert_error_at

SAMPLE_ID = "6f1c1d2e-4b7a-4c3e-9a51-2f0e8d9c7b10"
ERROR_SCHEMA = {"$ref": "#/components/schemas/ErrorOut"}
# The OpenAI-compatible routes answer errors in OpenAI's shape (api/openai_errors.py).
OPENAI_ERROR_SCHEMA = {"$ref": "#/components/schemas/OpenAIErrorOut"}
UUID_SCHEMA = {"type": "string", "format": "uuid"}


@pytest.fixture
async def spec(api: ApiClient) -> dict[str, Any]:
    r = await api.get("/openapi.json")
    assert r.status_code == 200
    document: dict[str, Any] = r.json()
    return document


def operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            yield method.upper(), path, operation


def concrete(path: str) -> str:
    return path.replace("{session_id}", SAMPLE_ID)


def schema_of(spec: dict[str, Any], ref_or_schema: dict[str, Any]) -> dict[str, Any]:
    ref = ref_or_schema.get("$ref")
    if ref is None:
        return ref_or_schema
    schema: dict[str, Any] = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return schema


def body_schema(spec: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    operation = spec["paths"][path][method.lower()]
    return schema_of(spec, operation["requestBody"]["content"]["application/json"]["schema"])


def body_cap(api: ApiClient, method: str, path: str) -> int:
    """The most bytes a request's body may have there: 1 MB, or an import's own cap."""
    if (method, path) in imports.LARGE_BODIES:
        return api.settings.import_max_bytes
    return MAX_BODY_BYTES


def documented(spec: dict[str, Any], method: str, path: str, status: int) -> dict[str, Any]:
    responses = spec["paths"][path][method.lower()]["responses"]
    assert str(status) in responses, f"{method} {path} answers {status}, undocumented"
    response: dict[str, Any] = responses[str(status)]
    return response


# -------------------------------------------------------------- UUIDs


async def test_session_ids_are_uuids_in_the_schema(spec: dict[str, Any]) -> None:
    for path in ("/chat", "/chat/clear-session"):
        field = body_schema(spec, "POST", path)["properties"]["session_id"]
        assert UUID_SCHEMA in field["anyOf"], field
    (header,) = [
        p for p in spec["paths"]["/chat"]["post"]["parameters"] if p["name"] == "x-session-id"
    ]
    # Optional, and never null: a header is either sent or not.
    assert header["in"] == "header" and not header.get("required")
    assert {k: header["schema"][k] for k in UUID_SCHEMA} == UUID_SCHEMA
    (path_param,) = [
        p
        for p in spec["paths"]["/chat/export/{session_id}"]["get"]["parameters"]
        if p["in"] == "path"
    ]
    assert path_param["name"] == "session_id"
    assert {k: path_param["schema"][k] for k in UUID_SCHEMA} == UUID_SCHEMA
    assert "X-Session-ID" in documented(spec, "POST", "/chat", 200)["headers"]


async def test_a_malformed_session_id_in_the_path_is_400_naming_it(api: ApiClient) -> None:
    _, auth = api.new_user()
    r = await api.get("/chat/export/not-a-uuid", headers=auth)
    body = assert_error(r, 400, "bad_request")
    assert "session_id" in body["detail"] and "UUID" in body["detail"]


async def test_session_ids_in_any_case_are_accepted_everywhere(
    api: ApiClient, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    session_id = (await chat(api, auth, "first"))["session_id"]
    upper = session_id.upper()
    r = await api.post(
        "/chat", json={"message": "by header"}, headers={**auth, "X-Session-ID": upper}
    )
    assert r.status_code == 200 and r.json()["session_id"] == session_id, r.text
    assert (await chat(api, auth, "by body", session_id=upper))["session_id"] == session_id
    r = await api.get(f"/chat/export/{upper}", headers=auth)
    assert r.status_code == 200 and r.json()["session"]["id"] == session_id, r.text
    r = await api.post("/chat/clear-session", json={"session_id": upper}, headers=auth)
    assert r.status_code == 200 and r.json()["cleared_session_id"] == session_id, r.text


# ------------------------------------------------------------ security


async def test_the_bearer_scheme_is_declared_and_required_everywhere_but_health(
    spec: dict[str, Any],
) -> None:
    schemes = spec["components"]["securitySchemes"]
    ((name, scheme),) = schemes.items()
    assert scheme["type"] == "http" and scheme["scheme"].lower() == "bearer"
    assert scheme.get("bearerFormat") == "JWT"
    for method, path, operation in operations(spec):
        if (method, path) == ("GET", "/health"):
            assert "security" not in operation
        else:
            assert operation.get("security") == [{name: []}], (method, path)


async def test_docs_offer_the_authorize_button(api: ApiClient) -> None:
    """Swagger UI shows Authorize when the document declares a security scheme."""
    r = await api.get("/docs")
    assert r.status_code == 200 and "swagger-ui" in r.text and "/openapi.json" in r.text


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer   ", "Basic dXNlcjpwdw==", "Token abc", "Bearer garbage"],
    ids=["none", "empty", "no-token", "blank-token", "basic", "other-scheme", "garbage"],
)
async def test_every_protected_endpoint_answers_our_401(
    api: ApiClient, spec: dict[str, Any], model: FakeOpenAI, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    for method, path, _ in operations(spec):
        if path == "/health":
            continue
        body = {} if method in ("POST", "PUT") else None
        r = await api.request(method, concrete(path), json=body, headers=headers)
        assert_error_at(path, r, 401, "unauthorized")
        assert r.headers["www-authenticate"] == "Bearer"
        documented(spec, method, path, 401)
    assert model.calls == 0


# --------------------------------------------------------- responses


async def test_every_error_status_uses_the_error_schema(spec: dict[str, Any]) -> None:
    for method, path, operation in operations(spec):
        for status, response in operation["responses"].items():
            if path == "/health" or not status.startswith(("4", "5")):
                continue
            content = response["content"]["application/json"]["schema"]
            expected = OPENAI_ERROR_SCHEMA if path.startswith(OPENAI_PREFIX) else ERROR_SCHEMA
            assert content == expected, (method, path, status)
    schemas = spec["components"]["schemas"]
    assert "HTTPValidationError" not in schemas  # FastAPI's 422 shape is not ours
    assert set(schemas["ErrorOut"]["required"]) == {"error", "detail", "request_id"}


async def test_each_endpoint_documents_the_statuses_it_can_answer(spec: dict[str, Any]) -> None:
    for method, path, operation in operations(spec):
        statuses = {int(s) for s in operation["responses"]}
        if path == "/health":
            # 400: more than 50 query parameters, refused before any route.
            assert statuses == {200, 400, 503}
            for status in (200, 503):
                schema = operation["responses"][str(status)]["content"]["application/json"]
                assert schema["schema"] == {"$ref": "#/components/schemas/HealthOut"}
            continue
        expected = {200, 400, 401, 503}  # 400: more than 50 query parameters
        if operation.get("parameters") or "requestBody" in operation:
            expected.add(422)
        if "requestBody" in operation:
            expected |= {400, 413}  # invalid JSON, body over 1 MB (an import's: its own cap)
        assert expected <= statuses, (method, path, sorted(statuses))
    chat_statuses = {int(s) for s in spec["paths"]["/chat"]["post"]["responses"]}
    assert {400, 404, 409, 413, 422, 429, 502, 503, 504} <= chat_statuses
    limited = spec["paths"]["/chat"]["post"]["responses"]["429"]
    assert limited["headers"]["Retry-After"]["required"] is True
    for method, path in (("GET", "/chat/export/{session_id}"), ("GET", "/sessions")):
        documented(spec, method, path, 400)  # malformed id / cursor
    for method, path in (("GET", "/sessions/active"), ("POST", "/chat/clear-session")):
        documented(spec, method, path, 404)
    documented(spec, "PUT", "/memory", 409)


async def test_what_the_endpoints_answer_is_documented(
    api: ApiClient, spec: dict[str, Any], model: FakeOpenAI
) -> None:
    """Each error provoked on each endpoint is in that endpoint's responses."""
    _, auth = api.new_user()
    for method, path, operation in operations(spec):
        if path == "/health":
            continue
        url = concrete(path)
        provoked: list[tuple[int, Any]] = []
        names = {p["name"] for p in operation.get("parameters", [])}
        if "agent_name" in names:
            r = await api.request(method, url, params={"agent_name": "no spaces"}, headers=auth)
            provoked.append((422, r))
        if "format" in names:
            r = await api.request(method, url, params={"format": "pdf"}, headers=auth)
            provoked.append((422, r))
        if "requestBody" in operation:
            json_headers = {**auth, "Content-Type": "application/json"}
            r = await api.request(method, url, content=b"{not json", headers=json_headers)
            provoked.append((400, r))
            r = await api.request(method, url, json={"unknown_field": 1}, headers=auth)
            provoked.append((422, r))
            over = b"{" + b" " * (body_cap(api, method, path) - 1) + b"}"
            r = await api.request(method, url, content=over, headers=json_headers)
            provoked.append((413, r))
        for status, response in provoked:
            assert response.status_code == status, (method, path, response.text)
            documented(spec, method, path, status)


async def test_an_unreachable_database_is_a_documented_503(
    spec: dict[str, Any], model: FakeOpenAI
) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = make_settings(f"postgresql://nobody@127.0.0.1:{port}/none", model.url)
    api = ApiClient(settings)
    try:
        token = api.token_for(uuid.uuid4())
        r = await api.get("/memory", headers={"Authorization": f"Bearer {token}"})
        assert_error(r, 503, "database_unavailable")
        documented(spec, "GET", "/memory", 503)
        r = await api.get("/health")
        assert r.status_code == 503 and r.json() == {
            "status": "degraded",
            "database": "unreachable",
        }
    finally:
        await api.aclose()


async def test_the_throttle_is_a_documented_429_with_retry_after(
    database_url: str, model: FakeOpenAI, spec: dict[str, Any]
) -> None:
    api = ApiClient(
        make_settings(database_url, model.url, chat_rate_per_minute=1, chat_rate_burst=1)
    )
    try:
        _, auth = api.new_user()
        await chat(api, auth, "the one allowed")
        r = await api.post("/chat", json={"message": "one too many"}, headers=auth)
        assert_error(r, 429, "rate_limited")
        assert int(r.headers["retry-after"]) >= 1
        documented(spec, "POST", "/chat", 429)
    finally:
        await api.aclose()


async def test_the_import_body_is_described_with_both_forms(spec: dict[str, Any]) -> None:
    """The route reads its body itself (so a malformed record is a 422 naming
    it): its schema is the operation's own, either form, nothing left to resolve."""
    body = spec["paths"]["/sessions/import"]["post"]["requestBody"]
    assert body["required"] is True
    schema = body["content"]["application/json"]["schema"]
    plain, single = schema["anyOf"]
    assert plain["required"] == ["sessions"] and set(single["required"]) == {"session", "messages"}
    message = plain["properties"]["sessions"]["items"]["properties"]["messages"]["items"]
    roles = {option["properties"]["role"]["const"] for option in message["oneOf"]}
    assert roles == {"user", "assistant", "tool"}
    user = next(o for o in message["oneOf"] if o["properties"]["role"]["const"] == "user")
    created_at = user["properties"]["created_at"]
    assert (created_at["type"], created_at["format"]) == ("string", "date-time")
    assert "$ref" not in json.dumps(body)
    assert "Retry-After" in documented(spec, "POST", "/sessions/import", 429)["headers"]


# ---------------------------------------------------- methods per path


def methods_of(spec: dict[str, Any], path: str) -> str:
    return ", ".join(sorted(m.upper() for m in spec["paths"][path]))


async def test_405_lists_every_method_of_the_path(api: ApiClient, spec: dict[str, Any]) -> None:
    assert methods_of(spec, "/memory") == "DELETE, GET, PUT"
    for path in spec["paths"]:
        allowed = methods_of(spec, path)
        wrong = next(m for m in ("PATCH", "POST", "GET") if m not in allowed.split(", "))
        r = await api.request(wrong, concrete(path))
        body = assert_error(r, 405, "method_not_allowed")
        assert r.headers["allow"] == allowed, (path, r.headers["allow"])
        assert allowed in body["detail"]


async def test_a_plain_options_is_204_with_the_allowed_methods(
    api: ApiClient, spec: dict[str, Any]
) -> None:
    for path in spec["paths"]:
        r = await api.options(concrete(path))
        assert r.status_code == 204, (path, r.text)
        assert r.headers["allow"] == methods_of(spec, path)
        assert r.content == b"" and r.headers["x-request-id"]
    assert_error(await api.options("/nope"), 404, "not_found")


@pytest.fixture
async def cors_api(database_url: str, model: FakeOpenAI) -> AsyncIterator[ApiClient]:
    settings = make_settings(database_url, model.url, cors_allow_origins="https://app.example")
    client = ApiClient(settings)
    yield client
    await client.aclose()


async def test_with_cors_preflights_are_the_cors_middlewares_and_plain_options_ours(
    cors_api: ApiClient,
) -> None:
    preflight = await cors_api.options(
        "/memory",
        headers={
            "Origin": "https://app.example",
            "Access-Control-Request-Method": "PUT",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 200, preflight.text
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    assert "PUT" in preflight.headers["access-control-allow-methods"]

    plain = await cors_api.options("/memory", headers={"Origin": "https://app.example"})
    assert plain.status_code == 204
    assert plain.headers["allow"] == "DELETE, GET, PUT"
    assert plain.headers["access-control-allow-origin"] == "https://app.example"
