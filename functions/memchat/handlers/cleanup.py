"""CleanupFunction: the TTL cleanup, invoked by EventBridge Scheduler.

The event is the schedule's input (see template.yaml); `{"dry_run": true}`
only counts. The run stops in time to return before the function's timeout.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from memchat import observability, secrets
from memchat.config import ConfigError
from memchat.usecases.cleanup import run_cleanup

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


def _batch_size() -> int:
    raw = os.environ.get("CLEANUP_BATCH_SIZE", "1000")
    if not raw.strip().isdigit() or not 1 <= int(raw) <= 100_000:
        raise ConfigError("invalid configuration: CLEANUP_BATCH_SIZE must be 1..100000")
    return int(raw)


conninfo = secrets.database_url()
batch_size = _batch_size()
observability.configure(os.environ.get("LOG_LEVEL", "INFO").upper())


@observability.scheduled_handler
def handler(event: Any, context: LambdaContext) -> dict[str, Any]:
    dry_run = isinstance(event, dict) and event.get("dry_run") is True
    result = run_cleanup(
        conninfo,
        batch_size=batch_size,
        dry_run=dry_run,
        remaining_ms=context.get_remaining_time_in_millis,
    )
    observability.record_cleanup(result)
    return result.as_dict()
