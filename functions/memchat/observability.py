"""Logs, metrics and traces for the Lambda functions (Powertools).

- Logs: one JSON line per record, service "memchat", with the Lambda context
  and a correlation id (API Gateway's request id for HTTP, the Scheduler's
  execution id for cleanup). The Powertools logger *is* the stdlib logger
  "memchat", so the app's `logging.getLogger("memchat.<module>")` records
  come out through it with their `extra=` fields. The event is never logged
  (it carries the bearer token and the user's message), whatever
  POWERTOOLS_LOGGER_LOG_EVENT says. Each request adds one access line
  (message "request": method, route, status, duration_ms, request_id,
  user_id; memchat.logs) and an unexpected error its type and place.
- Metrics: CloudWatch embedded metric format, namespace "memchat": request
  latency and counts per route, chat-turn timings and tokens (through the
  chat service's turn observer), cleanup counts, summary-worker counts,
  tokens and lag, and the cold-start metric.
- Traces: X-Ray through Powertools Tracer, only when asked for with
  POWERTOOLS_TRACE_DISABLED=false (the template's EnableTracing parameter)
  and aws-xray-sdk is installed; responses and errors are never attached.

Example:
    from memchat import observability

    observability.configure("INFO")

    @observability.http_handler
    def handler(event, context):
        return adapter(event, context)
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers
from aws_lambda_powertools.metrics import MetricUnit

from memchat import logs

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

    from memchat.usecases.chat import ChatResult
    from memchat.usecases.cleanup import CleanupResult
    from memchat.usecases.summarize import SummaryRun

SERVICE = "memchat"
NAMESPACE = "memchat"
# Libraries whose records are worth keeping in production, at WARNING and up.
THIRD_PARTY_LOGGERS = {"mangum", "httpx", "openai", "psycopg", "jwt"}

Handler = Callable[[Any, Any], Any]  # (event, context) -> response

logger = Logger(service=SERVICE)
metrics = Metrics(namespace=NAMESPACE, service=SERVICE)


def tracing_requested(environ: Mapping[str, str] | None = None) -> bool:
    """True when POWERTOOLS_TRACE_DISABLED is explicitly false (off by default)."""
    env = os.environ if environ is None else environ
    return env.get("POWERTOOLS_TRACE_DISABLED", "true").strip().lower() in {"false", "0", "no"}


def _make_tracer() -> Any:
    if not tracing_requested():
        return None
    if importlib.util.find_spec("aws_xray_sdk") is None:
        logger.warning("tracing requested but aws-xray-sdk is not installed: tracing is off")
        return None
    from aws_lambda_powertools import Tracer

    return Tracer(service=SERVICE)


tracer = _make_tracer()


def configure(log_level: str | int = "INFO") -> None:
    """Set the log level and route third-party library records through our format.

    Each record logged while a request is served carries its request id,
    also as `correlation_id`: behind API Gateway the same id Powertools takes
    from the event; the only one in the streaming functions (uvicorn behind
    the Lambda Web Adapter, where no handler sets one)."""
    logger.setLevel(log_level)
    logger.append_keys(name="%(name)s")
    handler = logger.registered_handler
    if not any(isinstance(f, logs.RequestIdFilter) for f in handler.filters):
        handler.addFilter(logs.RequestIdFilter(correlation_id=True))
    copy_config_to_registered_loggers(
        source_logger=logger, log_level=logging.WARNING, include=set(THIRD_PARTY_LOGGERS)
    )


def _instrument(handler: Handler, correlation_id_path: str | None) -> Handler:
    wrapped = handler
    if tracer is not None:
        wrapped = tracer.capture_lambda_handler(
            wrapped, capture_response=False, capture_error=False
        )
    wrapped = metrics.log_metrics(wrapped, capture_cold_start_metric=True)
    return logger.inject_lambda_context(
        wrapped, log_event=False, correlation_id_path=correlation_id_path
    )


def http_handler(handler: Handler) -> Handler:
    """Instrument an API Gateway (HTTP API, payload 2.0) handler.

    Adds per-request metrics under the dimension `route` (API Gateway's
    route key, e.g. "POST /chat"): RequestLatency, Requests, Http4xx, Http5xx.
    """

    @functools.wraps(handler)
    def timed(event: Any, context: LambdaContext) -> Any:
        started = time.perf_counter()
        response = handler(event, context)
        status = int(response.get("statusCode", 0)) if isinstance(response, dict) else 0
        route = str(event.get("routeKey") or "unknown") if isinstance(event, dict) else "unknown"
        record_request(route, status, (time.perf_counter() - started) * 1000)
        return response

    return _instrument(timed, correlation_paths.API_GATEWAY_HTTP)


def scheduled_handler(handler: Handler) -> Handler:
    """Instrument an EventBridge Scheduler handler (correlation id: execution id)."""
    return _instrument(handler, "execution_id")


def record_request(route: str, status: int, latency_ms: float) -> None:
    metrics.add_dimension(name="route", value=route)
    metrics.add_metric(name="RequestLatency", unit=MetricUnit.Milliseconds, value=latency_ms)
    metrics.add_metric(name="Requests", unit=MetricUnit.Count, value=1)
    metrics.add_metric(name="Http4xx", unit=MetricUnit.Count, value=int(400 <= status < 500))
    metrics.add_metric(name="Http5xx", unit=MetricUnit.Count, value=int(status >= 500))


def record_turn(result: ChatResult) -> None:
    """Turn observer for the chat service: timings and tokens, never content."""
    timings = result.timings
    if result.replayed:
        metrics.add_metric(name="ReplayedTurns", unit=MetricUnit.Count, value=1)
    for key, name in (
        ("retrieval_ms", "MemoryRetrievalLatency"),
        ("model_ms", "ModelLatency"),
        ("record_ms", "RecordLatency"),
    ):
        if key in timings:
            metrics.add_metric(name=name, unit=MetricUnit.Milliseconds, value=timings[key])
    if timings:
        metrics.add_metric(
            name="TurnLatency", unit=MetricUnit.Milliseconds, value=sum(timings.values())
        )
    for key, name in (("prompt_tokens", "PromptTokens"), ("completion_tokens", "CompletionTokens")):
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=result.usage.get(key, 0))
    metrics.add_metric(
        name="MessagesInContext",
        unit=MetricUnit.Count,
        value=int(result.memory.get("messages_in_context", 0)),
    )


def record_cleanup(result: CleanupResult) -> None:
    metrics.add_metric(name="DeletedSessions", unit=MetricUnit.Count, value=result.deleted_sessions)
    metrics.add_metric(name="DeletedMessages", unit=MetricUnit.Count, value=result.deleted_messages)
    metrics.add_metric(name="DeletedMemories", unit=MetricUnit.Count, value=result.deleted_memories)
    metrics.add_metric(name="CleanupBatches", unit=MetricUnit.Count, value=result.batches)
    metrics.add_metric(
        name="CleanupDuration", unit=MetricUnit.Milliseconds, value=result.duration_ms
    )
    metrics.add_metric(
        name="CleanupUnfinished", unit=MetricUnit.Count, value=int(not result.finished)
    )


def record_summaries(run: SummaryRun) -> None:
    """A summary worker run: sessions summarized, failures, tokens, lag."""
    count = MetricUnit.Count
    metrics.add_metric(name="SessionsSummarized", unit=count, value=run.summarized)
    metrics.add_metric(name="SummaryFailures", unit=count, value=run.failed)
    metrics.add_metric(name="SummariesGivenUp", unit=count, value=run.gave_up)
    metrics.add_metric(name="SummaryTokensIn", unit=count, value=run.tokens_in)
    metrics.add_metric(name="SummaryTokensOut", unit=count, value=run.tokens_out)
    metrics.add_metric(
        name="SummaryRunDuration", unit=MetricUnit.Milliseconds, value=run.duration_ms
    )
    # How long the oldest due session had waited when the run began (0: none due).
    metrics.add_metric(name="SummaryLag", unit=MetricUnit.Seconds, value=run.lag_seconds or 0.0)
    metrics.add_metric(name="SummaryUnfinished", unit=count, value=int(not run.finished))
