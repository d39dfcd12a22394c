"""CleanupFunction: the TTL cleanup, invoked by EventBridge Scheduler.

The event is the schedule's input (see template.yaml); `{"dry_run": true}`
only counts. The run stops in time to return before the function's timeout.
It reads one secret, its own DATABASE_URL: deployed, the pooler URL of the
`memchat_cleanup` role, which can see and delete only expired sessions
(docs/deploy.md, "Database roles"), not the API's. ROUTE_GROUPS=cleanup
narrows its settings to that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memchat import bootstrap, observability, secrets
from memchat.usecases.cleanup import TimeBudget

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


settings = secrets.load_settings(job="cleanup")
observability.configure(settings.log_level)
cleanup = bootstrap.cleanup(settings)


@observability.scheduled_handler
def handler(event: Any, context: LambdaContext) -> dict[str, Any]:
    dry_run = isinstance(event, dict) and event.get("dry_run") is True
    result = cleanup.dry_run() if dry_run else cleanup.run(TimeBudget.of_lambda(context))
    observability.record_cleanup(result)
    return result.as_dict()
