"""Routes the chat function serves on demand (memchat.api.on_demand.RoutesOnDemand):
/v1, /memory/search and /mcp are included on their first request, not when
the app is built (the chat handler's cold import, docs/benchmarks.md), and
behave from that first request as if they had always been there: the answer,
a 405 naming the methods, the error shapes, the OpenAPI document."""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator

import pytest
from fastapi import FastAPI

from memchat.api.middleware import flat_routes
from memchat.api.on_demand import RoutesOnDemand
from memchat.config import Settings
from tests.utils.api import ApiClient
from tests.utils.chat_api import assert_error

ON_DEMAND = {
    "/memory/search": "memchat.api.routes.search",
    "/memories": "memchat.api.routes.memories",
    "/v1": "memchat.api.routes.completions",
    "/mcp": "memchat.api.routes.mcp",
}


def paths(app: FastAPI) -> set[str]:
    return {str(getattr(route, "path", "")) for route in flat_routes(app.router.routes)}


@pytest.fixture
async def fresh(settings: Settings) -> AsyncIterator[ApiClient]:
    """A new app serving chat, none of its on-demand routes requested yet."""
    client = ApiClient(settings.model_copy(update={"route_groups": frozenset({"chat"})}))
    yield client
    await client.aclose()


def on_demand_of(app: FastAPI) -> RoutesOnDemand:
    middleware = next(m for m in app.user_middleware if m.cls.__name__ == "LoadRoutes")
    routes = middleware.kwargs["routes"]
    assert isinstance(routes, RoutesOnDemand)
    return routes


@pytest.mark.parametrize(("prefix", "module"), ON_DEMAND.items())
def test_each_module_serves_only_paths_under_its_prefix(prefix: str, module: str) -> None:
    # A path outside the prefix would 404 until something else loaded the module.
    router = importlib.import_module(module).router
    assert router.routes
    for route in router.routes:
        assert route.path == prefix or route.path.startswith(prefix + "/"), (module, route.path)


async def test_the_chat_app_is_built_without_them_and_says_which(fresh: ApiClient) -> None:
    assert on_demand_of(fresh.app).pending == ON_DEMAND
    assert not paths(fresh.app) & {"/memory/search", "/v1/models", "/v1/chat/completions", "/mcp"}
    assert "/chat" in paths(fresh.app)


async def test_the_first_request_is_served_and_includes_its_routes_only(fresh: ApiClient) -> None:
    _, headers = fresh.new_user()
    response = await fresh.get("/v1/models", headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["object"] == "list"
    assert {"/v1/models", "/v1/chat/completions"} <= paths(fresh.app)
    assert set(on_demand_of(fresh.app).pending) == {"/memory/search", "/memories", "/mcp"}
    # The memory search's first request: its own validation, its error JSON.
    response = await fresh.get("/memory/search", params={"k": "0"}, headers=headers)
    assert_error(response, 422, "validation_error")
    assert set(on_demand_of(fresh.app).pending) == {"/memories", "/mcp"}


async def test_a_first_request_with_the_wrong_method_is_a_405(fresh: ApiClient) -> None:
    _, headers = fresh.new_user()
    response = await fresh.delete("/memory/search", headers=headers)
    assert_error(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "GET"


async def test_a_first_request_refused_for_its_size_names_its_route(fresh: ApiClient) -> None:
    _, headers = fresh.new_user()
    response = await fresh.post(
        "/v1/chat/completions",
        content=b"x" * 10,
        headers={**headers, "Content-Length": str(2_000_000), "Content-Type": "application/json"},
    )
    assert response.status_code == 413
    assert "/v1/chat/completions" in paths(fresh.app)  # loaded before the refusal


async def test_the_openapi_document_has_every_route(fresh: ApiClient) -> None:
    response = await fresh.get("/openapi.json")
    assert response.status_code == 200
    documented = set(response.json()["paths"])
    assert {"/chat", "/memory/search", "/v1/models", "/v1/chat/completions"} <= documented
    assert on_demand_of(fresh.app).pending == {}
    # Each on-demand JSON body's 415 is documented as every other's.
    operation = response.json()["paths"]["/v1/chat/completions"]["post"]
    assert "415" in operation["responses"]


@pytest.mark.parametrize("group", ["sessions", "export"])
async def test_the_other_functions_serve_none_of_them(settings: Settings, group: str) -> None:
    client = ApiClient(settings.model_copy(update={"route_groups": frozenset({group})}))
    try:
        assert on_demand_of(client.app).pending == {}
        _, headers = client.new_user()
        assert_error(await client.get("/v1/models", headers=headers), 404, "not_found")
        assert not {"/v1/models", "/memory/search", "/mcp"} & paths(client.app)
    finally:
        await client.aclose()
