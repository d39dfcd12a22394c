"""A turn's suggested follow-ups (SUGGESTIONS, a request's `suggest`): up to
three short questions the user might send next, never stored as messages.

They are not made after the answer, keeping it waiting. A turn answered
whole asks the model for them beside its answer, from the conversation's
end and the new question (the answer is not known yet), and once the turn
is stored waits for them at most WAIT_SECONDS more (they are short, so they
are usually there first; else the answer comes without them). A streamed
turn asks once its answer is written, from the answer too, and its stream
sends them after `done`. A failure gives none (logged), never a failed turn; a turn
that ends with a call of the client's tools has none.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memchat.prompts import suggestions as prompt

if TYPE_CHECKING:
    from memchat.model.client import ModelClient

logger = logging.getLogger(__name__)

# How long a turn answered whole waits for its follow-ups once it is stored.
WAIT_SECONDS = 2.0


@dataclass
class FollowUps:
    model: ModelClient
    conversation: list[tuple[str, str]]  # (role, text): the window's end and the question
    streamed: bool
    task: asyncio.Task[list[str]] | None = field(default=None, repr=False)

    @classmethod
    def begin(
        cls,
        model: ModelClient,
        window: list[dict[str, Any]],
        question: str,
        *,
        streamed: bool,
    ) -> FollowUps:
        """The follow-ups of a turn whose model call is about to start (the
        window as the model is sent it, OpenAI's shape)."""
        said = [
            (str(m["role"]), str(m["content"]))
            for m in window
            if m.get("role") in ("user", "assistant") and m.get("content")
        ]
        follow_ups = cls(model, [*said[-prompt.CONTEXT_MESSAGES :], ("user", question)], streamed)
        if not streamed:
            follow_ups.task = asyncio.create_task(follow_ups._ask(None))
        return follow_ups

    async def settle(
        self, answer: str, *, ended_with_calls: bool
    ) -> tuple[list[str] | None, asyncio.Task[list[str]] | None]:
        """Once the turn is stored: (the follow-ups, None) for a turn answered
        whole, (None, the task making them) for a streamed one."""
        if ended_with_calls:
            self.cancel()
            return [], None
        if self.streamed:
            self.task = asyncio.create_task(self._ask(answer))
            return None, self.task
        task, self.task = self.task, None
        if task is None:
            return [], None
        return await settled(task, WAIT_SECONDS), None

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()
            self.task = None

    async def _ask(self, answer: str | None) -> list[str]:
        conversation = self.conversation + ([("assistant", answer)] if answer else [])
        question = self.conversation[-1][1]
        try:
            completion = await self.model.complete(
                prompt.prompt(conversation), max_tokens=prompt.MAX_TOKENS
            )
        except Exception as exc:  # the turn is answered either way
            logger.warning("suggestions failed", extra={"error": type(exc).__name__})
            return []
        found = prompt.read(completion.content, question)
        logger.debug("suggestions made", extra={"suggestions": len(found)})
        return found


async def settled(task: asyncio.Task[list[str]], seconds: float) -> list[str]:
    """A streamed turn's follow-ups, once made (none after `seconds`)."""
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if task in done and not task.cancelled():
        return task.result()
    task.cancel()
    return []
