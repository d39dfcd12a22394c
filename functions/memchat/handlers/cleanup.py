"""CleanupFunction: the TTL cleanup, invoked by EventBridge Scheduler.

The event is the schedule's input (see template.yaml); `{"dry_run": true}`
only counts. The run stops in time to return before the function's timeout.
It reads one secret, its own DATABASE_URL: deployed, the pooler URL of the
`memchat_cleanup` role, which can see and delete only expired sessions
(docs/deploy.md, "Database roles"), not the API's.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from memchat import observability, secrets
from memchat.usecases.cleanup import run_cleanup, settings_from_env

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


conninfo = secrets.database_url()
batch_size, pause_factor = settings_from_env()
observability.configure(os.environ.get("LOG_LEVEL", "INFO").upper())


@observability.scheduled_handler
def handler(event: Any, context: LambdaContext) -> dict[str, Any]:
    dry_run = isinstance(event, dict) and event.get("dry_run") is True
    result = run_cleanup(
        conninfo,
        batch_size=batch_size,
        pause_factor=pause_factor,
        dry_run=dry_run,
        remaining_ms=context.get_remaining_time_in_millis,
    )
    observability.record_cleanup(result)
    return result.as_dict()
