"""OpenAI-compatible chat completions with bounded retries and timeouts.

The `openai` SDK is imported on first use: it is the heaviest import of the
chat path and most cold starts never need it before the first request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memchat.errors import UpstreamError, UpstreamTimeout

if TYPE_CHECKING:
    import httpx2 as httpx  # the HTTP library of the openai SDK (>= 3)
    from openai import AsyncOpenAI

    from memchat.config import Settings


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text as the model wrote it

    def parsed(self) -> dict[str, Any]:
        value = json.loads(self.arguments or "{}")
        if not isinstance(value, dict):
            raise ValueError("tool arguments must be a JSON object")
        return value


@dataclass(frozen=True)
class Completion:
    content: str
    tool_calls: list[ToolCall]
    model: str
    usage: dict[str, int] = field(default_factory=dict)


class ModelClient:
    """One async client per process, reused by warm invocations."""

    def __init__(self, settings: Settings, http_client: httpx.AsyncClient | None = None) -> None:
        self.model = settings.openai_model
        self._settings = settings
        self._http_client = http_client
        self._client: AsyncOpenAI | None = None

    def _openai(self) -> AsyncOpenAI:
        if self._client is None:
            from openai import AsyncOpenAI

            settings = self._settings
            self._client = AsyncOpenAI(
                api_key=settings.openai_api_key or "offline",
                base_url=settings.openai_base_url,
                timeout=settings.openai_timeout_seconds,
                max_retries=settings.openai_max_retries,
                http_client=self._http_client,
            )
        return self._client

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        allow_tools: bool = True,
    ) -> Completion:
        """One chat completion; maps provider failures to 502/504 errors."""
        import openai

        kwargs: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            kwargs["tools"] = tools
            kwargs["tool_choice"] = "auto" if allow_tools else "none"
        try:
            response = await self._openai().chat.completions.create(**kwargs)
        except openai.APITimeoutError as exc:
            raise UpstreamTimeout() from exc
        except openai.APIStatusError as exc:
            raise UpstreamError(
                f"The model provider answered HTTP {exc.status_code}; nothing was stored."
            ) from exc
        except openai.APIError as exc:
            raise UpstreamError() from exc
        if not response.choices:
            raise UpstreamError("The model provider returned no answer; nothing was stored.")
        message = response.choices[0].message
        calls = [
            ToolCall(c.id, c.function.name, _without_nul_json(c.function.arguments or "{}"))
            for c in message.tool_calls or []
            if getattr(c, "function", None) is not None
        ]
        usage = {}
        if response.usage is not None:
            usage = {
                "prompt_tokens": response.usage.prompt_tokens or 0,
                "completion_tokens": response.usage.completion_tokens or 0,
            }
        content = (message.content or "").replace("\x00", "")
        return Completion(content, calls, response.model or self.model, usage)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def _without_nul(value: Any) -> Any:
    """`value` with NUL removed from every string: PostgreSQL text and jsonb
    cannot hold it, so a model that emits one would fail the turn when it is
    stored; it carries no meaning."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, list):
        return [_without_nul(v) for v in value]
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    return value


def _without_nul_json(arguments: str) -> str:
    """Tool-call arguments (JSON text) with NUL removed from every string."""
    if "\\u0000" not in arguments and "\x00" not in arguments:
        return arguments
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments.replace("\x00", "")
    return json.dumps(_without_nul(value), ensure_ascii=False)
