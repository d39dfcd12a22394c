"""A chat turn streamed: its events as they happen, for Server-Sent Events.

The turn itself is the ordinary one (ChatService.run); a listener passed to
it hears when its memory is ready (`started`), each piece of the answer as
the model writes it (`delta`) and each change the memory tool makes to the
notes (`notes`). `StreamedTurn` is that listener: it runs the turn as a task
and queues its events, so the HTTP edge can send them while the turn goes
on, and so the turn goes on (and is stored) even when the client is gone.

Failures before the turn has started (auth, validation, another user's
session, the throttle, the database) raise from `begin` as they would
without streaming; later ones end the stream with the failure.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from memchat.usecases.chat import ChatResult


class TurnListener(Protocol):
    async def started(self, session_id: uuid.UUID, agent_name: str, memory: dict[str, Any]) -> None:
        """The turn's memory is loaded; the model is about to be asked."""

    async def delta(self, text: str) -> None:
        """The next piece of the answer, as the model wrote it."""

    async def notes(self, operation: str) -> None:
        """The memory tool changed the notes (`append`, `overwrite`, ...)."""


@dataclass(frozen=True)
class TurnEvent:
    name: str  # start | delta | notes
    data: dict[str, Any]


logger = logging.getLogger(__name__)

# Turns whose client is gone still run to the end: hold them until they do.
_RUNNING: set[asyncio.Task[ChatResult]] = set()


class StreamedTurn:
    """A turn running as a task, its events queued as they happen."""

    def __init__(self) -> None:
        self._events: asyncio.Queue[TurnEvent] = asyncio.Queue()
        self._task: asyncio.Task[ChatResult] | None = None
        self._delivered = False

    # ----------------------------------------------------------- listener

    async def started(self, session_id: uuid.UUID, agent_name: str, memory: dict[str, Any]) -> None:
        data = {"session_id": str(session_id), "agent_name": agent_name, "memory": memory}
        self._events.put_nowait(TurnEvent("start", data))

    async def delta(self, text: str) -> None:
        self._events.put_nowait(TurnEvent("delta", {"text": text}))

    async def notes(self, operation: str) -> None:
        self._events.put_nowait(TurnEvent("notes", {"operation": operation}))

    # ------------------------------------------------------------ consumer

    async def begin(self, turn: Coroutine[Any, Any, ChatResult]) -> TurnEvent:
        """Run `turn` (which reports to this listener); returns its start event,
        or raises what failed before the turn started."""
        self._task = asyncio.create_task(turn)
        _RUNNING.add(self._task)
        self._task.add_done_callback(_RUNNING.discard)
        first = await self.next(wait=None)
        if isinstance(first, TurnEvent):
            return first
        if isinstance(first, BaseException):
            raise first
        raise RuntimeError("the turn ended without starting")

    async def next(self, wait: float | None) -> TurnEvent | ChatResult | BaseException | None:
        """The next event; then the turn's result (or its failure) once every
        event is out; None when nothing happened for `wait` seconds."""
        assert self._task is not None
        if not self._events.empty():
            return self._events.get_nowait()
        if self._task.done():
            return self._outcome()
        getter = asyncio.ensure_future(self._events.get())
        await asyncio.wait({getter, self._task}, timeout=wait, return_when="FIRST_COMPLETED")
        if getter.done():
            return getter.result()
        getter.cancel()
        if not self._events.empty():
            return self._events.get_nowait()
        return self._outcome() if self._task.done() else None

    def _outcome(self) -> ChatResult | BaseException:
        assert self._task is not None and self._task.done()
        self._delivered = True
        if self._task.cancelled():
            return asyncio.CancelledError()
        return self._task.exception() or self._task.result()

    async def finished(self) -> None:
        """Wait until the turn has ended (stored, or failed), whatever the client did."""
        if self._task is None:
            return
        await asyncio.wait({self._task})
        if self._delivered or self._task.cancelled():
            return
        failure = self._task.exception()  # retrieved here: nobody else will
        if failure is not None:
            logger.warning(
                "streamed turn failed after its client left; nothing was stored",
                extra={"error": getattr(failure, "code", type(failure).__name__)},
            )
