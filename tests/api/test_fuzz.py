"""Schema-driven fuzzing of the whole API (schemathesis), seeded and bounded.

Every operation in the app's own OpenAPI document is called with generated
requests, valid ones and invalid ones, with a real user's token, against the
real database and the local model server. Any 5xx fails the build, and so
does any answer the schema does not describe (status, content type,
headers, body). The run is deterministic (derandomized Hypothesis, no
example database) and sized to take about a minute here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi import checks

from memchat import bootstrap
from memchat.config import load_settings
from tests.conftest import make_settings
from tests.utils.api import ApiClient
from tests.utils.fake_openai import FakeOpenAI

# Examples per operation; FUZZ_EXAMPLES raises it for a longer local run.
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))


@pytest.fixture(scope="module")
def fuzz_app(database_url: str, fake_openai: FakeOpenAI) -> Iterator[Any]:
    app = bootstrap.app(make_settings(database_url, fake_openai.url))
    yield app


@pytest.fixture(scope="module")
def auth(fuzz_app: Any) -> dict[str, str]:
    """A real user's bearer token (the fuzzer may erase their data: DELETE /me)."""
    client = ApiClient(fuzz_app.state.memchat.settings, app=fuzz_app)
    _, headers = client.new_user()
    return headers


# Unknown query parameters are ignored, as most HTTP APIs do (a cache buster
# must not break a call), so they are not "invalid data" here; NUL is refused
# by the schema's own `pattern` (and tested on its own in test_errors.py).
FUZZ_CONFIG = {"generation": {"allow-extra-parameters": False, "allow-x00": False}}


@pytest.fixture(scope="module")
def api_schema(fuzz_app: Any) -> Any:
    config = SchemathesisConfig.from_dict(FUZZ_CONFIG)
    return schemathesis.openapi.from_asgi("/openapi.json", fuzz_app, config=config)


def _operations() -> list[tuple[str, str]]:
    """(method, path) of every documented operation, read from an app that is
    only built (it never connects), so pytest can list one test per operation."""
    app = bootstrap.app(
        load_settings(
            database_url="postgresql://localhost/unused",
            supabase_jwt_secret="collection-only-secret-of-at-least-32-chars",
            openai_api_key="collection-only",
        )
    )
    paths = app.openapi()["paths"]
    return [(method.upper(), path) for path in paths for method in paths[path]]


FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=True,  # the same examples every run: a failure reproduces
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


# Schema-valid requests these operations refuse on purpose, for reasons no
# schema can express: an X-Session-ID header and a body session_id naming
# different sessions (400); a cursor that is not one this API issued (400);
# a Chat Completions conversation with no user message to answer, or tool
# results that answer no call (400); a memory search with a cursor, or with
# a blank q (400).
SEMANTIC_CHECKS = {
    ("POST", "/chat"),
    ("GET", "/sessions"),
    ("GET", "/memories"),
    ("POST", "/v1/chat/completions"),
}


def _mutations(case: Any) -> tuple[Any, ...]:
    return tuple(getattr(case.meta.phase.data, "mutations", ()) or ())


def _authorize(case: Any, auth: dict[str, str]) -> None:
    """The real token, unless the case breaks the Authorization header on purpose."""
    broken = any(
        m.parameter_location == ParameterLocation.HEADER and m.parameter == "Authorization"
        for m in _mutations(case)
    )
    if not broken:
        case.headers = {**(case.headers or {}), **auth}


def _excluded_checks(method: str, path: str) -> list[Any]:
    if (method, path) in SEMANTIC_CHECKS:
        return [checks.positive_data_acceptance]
    return []


def _modes(method: str, path: str) -> list[GenerationMode]:
    """Negative requests need something to break: not for operations with no input."""
    return (
        [GenerationMode.POSITIVE]
        if (method, path) == ("GET", "/health")
        else [
            GenerationMode.POSITIVE,
            GenerationMode.NEGATIVE,
        ]
    )


@pytest.mark.parametrize(
    ("method", "path", "mode"),
    [(m, p, mode) for m, p in _operations() for mode in _modes(m, p)],
)
def test_every_answer_is_documented_and_none_is_a_server_error(
    api_schema: Any, auth: dict[str, str], method: str, path: str, mode: GenerationMode
) -> None:
    operation = api_schema[path][method]

    @FUZZ_SETTINGS
    @given(case=operation.as_strategy(generation_mode=mode))
    def call(case: Any) -> None:
        _authorize(case, auth)
        case.call_and_validate(excluded_checks=_excluded_checks(method, path))

    call()
