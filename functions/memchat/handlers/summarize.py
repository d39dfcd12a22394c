"""SummaryFunction: the rolling summary worker and the embedding backfill,
invoked by EventBridge Scheduler.

Every few minutes (template.yaml, SummarySchedule) it summarizes the
sessions their turns queued, then embeds the messages queued for
embeddings (imports), each until none is left or its time is nearly up
(usecases/summarize.py, usecases/backfill.py). It reads its own
DATABASE_URL (the pooler URL of the `memchat_worker` role, which can touch a
session only through the lease of a queue item it claimed; docs/deploy.md,
"Database roles") and the model keys; its settings are narrowed to those
(job="summaries"). It returns the summaries' run, with the embeddings' under
"embeddings".
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from memchat import bootstrap, observability, secrets
from memchat.model.tokens import counter_for_model

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


settings = secrets.load_settings(job="summaries")
observability.configure(settings.log_level)
summarizer, embedder = bootstrap.worker(settings)
# Warm invocations reuse the loop, and with it the connection and the HTTP client.
loop = asyncio.new_event_loop()
# Every summary is cut to SUMMARY_MAX_TOKENS: build the tokenizer in the init phase.
counter_for_model(settings.openai_model)


@observability.scheduled_handler
def handler(event: Any, context: LambdaContext) -> dict[str, Any]:
    run = loop.run_until_complete(summarizer.run(remaining_ms=context.get_remaining_time_in_millis))
    observability.record_summaries(run)
    embedded = loop.run_until_complete(
        embedder.run(remaining_ms=context.get_remaining_time_in_millis)
    )
    return {**run.as_dict(), "embeddings": embedded.as_dict()}
