"""What must never reach a log: checked in every form a record is printed."""

from __future__ import annotations

import json
import logging

import pytest
from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter

from memchat.logs import DevFormatter


def rendered(record: logging.LogRecord) -> str:
    """The record every way it can be printed: dev line, Powertools JSON, its fields."""
    return "\n".join(
        (
            DevFormatter().format(record),
            LambdaPowertoolsFormatter().format(record),
            json.dumps(record.__dict__, default=str),
        )
    )


def assert_not_logged(caplog: pytest.LogCaptureFixture, *texts: str) -> None:
    """None of `texts` is in any captured record, however it is printed."""
    for record in caplog.records:
        output = rendered(record)
        for text in texts:
            assert text not in output, (text, output)
