"""Invoking the Lambda handlers as Lambda would, against the real database.

`lambda_env` sets the environment a deployed function gets (through
monkeypatch, so nothing leaks into other tests); `lambda_` imports handler
modules fresh (module scope runs again: secrets, settings, app), invokes
them with sample events from tests/events/ and a fake context, captures the
JSON log lines, and afterwards closes what the handlers opened and puts the
process-wide logging and event-loop state back.

As deployed, the API functions log in as `memchat_api` (DATABASE_URL) and
the cleanup function as `memchat_cleanup` (its own DATABASE_URL secret):
`lambda_` imports the cleanup module with the cleanup role's URL.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import gc
import importlib
import io
import json
import logging
import os
import sys
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlencode

import pytest

from memchat import devtokens
from memchat.bootstrap import UNUSED_MODULES
from tests.conftest import JWT_SECRET
from tests.utils.fake_openai import FakeOpenAI

EVENTS = Path(__file__).resolve().parents[1] / "events"
HANDLER_PACKAGE = "memchat.handlers"
# Modules whose import does the per-instance set-up; dropped before and after each test.
INSTANCE_MODULES = (HANDLER_PACKAGE, "memchat.observability", "memchat.snapstart")
# Loggers the Powertools set-up reconfigures.
TOUCHED_LOGGERS = ("memchat", "mangum", "httpx", "openai", "psycopg", "jwt")


def load_event(name: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / name).read_text())
    return event


def http_event(
    name: str,
    *,
    token: str | None = None,
    body: Any = None,
    query: dict[str, str] | None = None,
    path: str | None = None,
    path_params: dict[str, str] | None = None,
    base64_body: bool = False,
) -> dict[str, Any]:
    """A sample API Gateway HTTP API (payload 2.0) event, adapted for one request."""
    event = copy.deepcopy(load_event(name))
    headers = event["headers"]
    headers.pop("authorization", None)
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    if body is not None:
        raw = json.dumps(body).encode()
        headers["content-type"] = "application/json"
        headers["content-length"] = str(len(raw))
        event["body"] = base64.b64encode(raw).decode() if base64_body else raw.decode()
        event["isBase64Encoded"] = base64_body
    if query is not None:
        event["queryStringParameters"] = query
        event["rawQueryString"] = urlencode(query)
    if path is not None:
        event["rawPath"] = path
        event["requestContext"]["http"]["path"] = path
    if path_params is not None:
        event["pathParameters"] = path_params
    event["requestContext"]["requestId"] = uuid.uuid4().hex[:14] + "EEJ="
    return event


def route_event(
    method: str, route_path: str, path: str, *, token: str | None = None, body: Any = None
) -> dict[str, Any]:
    """An event for any route, built on the health sample."""
    event = http_event("health.json", token=token, body=body, path=path)
    route_key = f"{method} {route_path}"
    event["routeKey"] = route_key
    event["requestContext"]["routeKey"] = route_key
    event["requestContext"]["http"]["method"] = method
    return event


@dataclass
class FakeContext:
    """The attributes of Lambda's context object that our code and Powertools read."""

    function_name: str = "memchat-ChatFunction-a1B2c3D4e5F6"
    memory_limit_in_mb: int = 1024
    remaining_ms: int = 29_000
    function_version: str = "$LATEST"
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    log_group_name: str = "/aws/lambda/memchat-ChatFunction-a1B2c3D4e5F6"
    log_stream_name: str = "2026/11/21/[$LATEST]0123456789abcdef0123456789abcdef"

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:eu-west-1:123456789012:function:{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def token_for(user_id: uuid.UUID) -> str:
    return devtokens.mint(JWT_SECRET, user_id)


def body_of(response: dict[str, Any]) -> Any:
    raw = response["body"]
    if response.get("isBase64Encoded"):
        raw = base64.b64decode(raw).decode()
    return json.loads(raw)


def _purge_instance_modules() -> None:
    # What a handler's cold start marks absent (bootstrap.UNUSED_MODULES, None
    # in sys.modules) is importable again for the rest of the process: the
    # SAM translator (test_template.py) imports pydantic.v1.
    for name in UNUSED_MODULES:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]
    for name in list(sys.modules):
        if any(name == m or name.startswith(m + ".") for m in INSTANCE_MODULES):
            del sys.modules[name]
            parent, _, child = name.rpartition(".")
            # `from memchat import observability` reads the package attribute first.
            if parent in sys.modules and hasattr(sys.modules[parent], child):
                delattr(sys.modules[parent], child)


class _LoggingSnapshot:
    """What the Powertools set-up changes in the process-wide logging tree."""

    def __init__(self) -> None:
        self.loggers = {}
        for name in TOUCHED_LOGGERS:
            lg = logging.getLogger(name)
            self.loggers[name] = (list(lg.handlers), lg.level, lg.propagate, dict(lg.__dict__))
        self.root_filters = {h: list(h.filters) for h in logging.root.handlers}

    def restore(self) -> None:
        for name, (handlers, level, propagate, attrs) in self.loggers.items():
            lg = logging.getLogger(name)
            lg.handlers = handlers
            lg.setLevel(level)
            lg.propagate = propagate
            for key in set(lg.__dict__) - set(attrs):
                delattr(lg, key)  # Powertools' "init"/"powertools_handler" markers
        for handler, filters in self.root_filters.items():
            handler.filters = filters


class LambdaRuntime:
    """Imports handler modules as a fresh Lambda instance would and invokes them.

    `function_env` holds a function's own values of variables the functions
    share (the cleanup function's DATABASE_URL): they apply while its module
    is imported, to those of the variables the test left set.
    """

    def __init__(self, function_env: dict[str, dict[str, str]] | None = None) -> None:
        self.logs = io.StringIO()
        self.modules: dict[str, ModuleType] = {}
        self.function_env = function_env or {}

    def load(self, name: str) -> ModuleType:
        """Import memchat.handlers.<name> (its module scope is the init phase)."""
        if name not in self.modules:
            own = {k: v for k, v in self.function_env.get(name, {}).items() if k in os.environ}
            saved = {k: os.environ[k] for k in own}
            os.environ.update(own)
            try:
                module = importlib.import_module(f"{HANDLER_PACKAGE}.{name}")
            finally:
                os.environ.update(saved)
            observability = importlib.import_module("memchat.observability")
            handler = observability.logger.registered_handler
            assert isinstance(handler, logging.StreamHandler)
            handler.setStream(self.logs)
            self.modules[name] = module
        return self.modules[name]

    def invoke(self, name: str, event: Any, context: FakeContext | None = None) -> Any:
        return self.load(name).handler(event, context or FakeContext())

    def log_records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.logs.getvalue().splitlines() if line.strip()]

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        # An init phase (memchat.bootstrap.lambda_app) and the before-snapshot
        # hook freeze the heap, here the test process's: give it back to the
        # collector, as the instance that froze it is gone.
        gc.unfreeze()
        http = sys.modules.get(f"{HANDLER_PACKAGE}.http")
        if http is not None:
            loop.run_until_complete(http.app.state.memchat.close())
        worker = sys.modules.get(f"{HANDLER_PACKAGE}.summarize")
        if worker is not None:
            worker.loop.run_until_complete(worker.summarizer.db.close())
            worker.loop.run_until_complete(worker.summarizer.model.close())
            worker.loop.close()


@pytest.fixture
def lambda_env(
    monkeypatch: pytest.MonkeyPatch, database_url: str, model: FakeOpenAI
) -> dict[str, str]:
    """The environment of a deployed function, pointed at the test database and model."""
    for name in list(os.environ):
        if name.endswith(("_SECRET_ARN", "_PARAMETER")) or name.startswith("POWERTOOLS_"):
            monkeypatch.delenv(name)
    for name in (
        "SUPABASE_URL",
        "CORS_ALLOW_ORIGINS",
        "MEMORY_ENABLED",
        "CLEANUP_BATCH_SIZE",
        "ROUTE_GROUPS",  # every route group, as with `memchat dev`, unless a test says
    ):
        monkeypatch.delenv(name, raising=False)
    env = {
        "DATABASE_URL": database_url,
        "SUPABASE_JWT_SECRET": JWT_SECRET,
        "OPENAI_API_KEY": "test-key",
        "OPENAI_BASE_URL": model.url,
        "OPENAI_MODEL": "fake-model",
        "OPENAI_MAX_RETRIES": "0",
        "OPENAI_TIMEOUT_SECONDS": "5",
        "LOG_LEVEL": "INFO",
        "POWERTOOLS_SERVICE_NAME": "memchat",
        "POWERTOOLS_METRICS_NAMESPACE": "memchat",
        "POWERTOOLS_TRACE_DISABLED": "true",
        "AWS_LAMBDA_FUNCTION_NAME": "memchat-ChatFunction-a1B2c3D4e5F6",
        "AWS_REGION": "eu-west-1",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def _current_loop() -> asyncio.AbstractEventLoop | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return asyncio.get_event_loop_policy().get_event_loop()
        except RuntimeError:
            return None


@pytest.fixture
def lambda_(
    lambda_env: dict[str, str],
    cleanup_url: str,
    worker_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[LambdaRuntime]:
    """A fresh Lambda instance: handler modules imported on first use."""
    # Powertools keeps "is this a cold start" in module globals.
    from aws_lambda_powertools.logging import logger as powertools_logger
    from aws_lambda_powertools.metrics.provider import cold_start

    monkeypatch.setattr(cold_start, "is_cold_start", True)
    monkeypatch.setattr(powertools_logger, "is_cold_start", True)
    logging_state = _LoggingSnapshot()
    previous = _current_loop()
    # mangum runs each invocation on the thread's current event loop, as in Lambda.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    _purge_instance_modules()
    runtime = LambdaRuntime(
        {"cleanup": {"DATABASE_URL": cleanup_url}, "summarize": {"DATABASE_URL": worker_url}}
    )
    try:
        yield runtime
    finally:
        try:
            runtime.close(loop)
        finally:
            _purge_instance_modules()
            loop.close()
            asyncio.set_event_loop(previous)
            logging_state.restore()
