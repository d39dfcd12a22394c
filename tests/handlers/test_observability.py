"""memchat.observability: tracing switch, turn observer, metric names."""

from __future__ import annotations

import importlib
import json
import uuid

import pytest

from memchat.usecases.chat import ChatResult
from tests.handlers.conftest import LambdaRuntime


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, False), ("true", False), ("1", False), ("false", True), ("False", True), ("0", True)],
)
def test_tracing_is_off_unless_asked_for(value: str | None, expected: bool) -> None:
    from memchat import observability

    env = {} if value is None else {"POWERTOOLS_TRACE_DISABLED": value}
    assert observability.tracing_requested(env) is expected


def test_tracing_without_xray_sdk_is_a_warning_not_a_crash(
    lambda_: LambdaRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "false")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    observability = importlib.import_module("memchat.observability")
    assert observability.tracer is None


def turn_result(**changes: object) -> ChatResult:
    values: dict[str, object] = {
        "answer": "hello",
        "session_id": uuid.uuid4(),
        "agent_name": "default",
        "model": "fake-model",
        "usage": {"prompt_tokens": 120, "completion_tokens": 30},
        "memory": {"messages_in_context": 4},
        "session": None,
        "timings": {"retrieval_ms": 2.5, "model_ms": 800.0, "record_ms": 3.5},
    }
    values.update(changes)
    return ChatResult(**values)  # type: ignore[arg-type]


def test_turn_observer_emits_timings_and_tokens_never_content(
    lambda_: LambdaRuntime, capsys: pytest.CaptureFixture[str]
) -> None:
    observability = importlib.import_module("memchat.observability")

    observability.record_turn(turn_result(answer="a very private answer"))
    observability.metrics.flush_metrics()

    line = next(x for x in capsys.readouterr().out.splitlines() if "TurnLatency" in x)
    record = json.loads(line)
    assert record["TurnLatency"] == [806.0]
    assert record["MemoryRetrievalLatency"] == [2.5]
    assert record["PromptTokens"] == [120.0] and record["CompletionTokens"] == [30.0]
    assert record["MessagesInContext"] == [4.0]
    assert "private" not in line


def test_replayed_turns_are_counted(
    lambda_: LambdaRuntime, capsys: pytest.CaptureFixture[str]
) -> None:
    observability = importlib.import_module("memchat.observability")
    observability.record_turn(turn_result(replayed=True, timings={}))
    observability.metrics.flush_metrics()
    record = json.loads(
        next(x for x in capsys.readouterr().out.splitlines() if "ReplayedTurns" in x)
    )
    assert record["ReplayedTurns"] == [1.0] and "TurnLatency" not in record
