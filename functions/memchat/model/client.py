"""OpenAI-compatible chat completions and embeddings, with bounded retries and timeouts.

The `openai` SDK is imported on first use: it is the heaviest import of the
chat path and most cold starts never need it before the first request.

The SDK builds its response objects without validating them, so a server
that answers 200 with a broken body (HTML from a proxy, truncated JSON,
fields of the wrong type) would only fail later, far from here, as a 500.
The body is therefore read here as plain JSON and every field we use is
checked: anything unexpected is the provider's failure (502, nothing
stored). Every string we keep is made storable (see `_safe_for_postgres`).

Streamed answers (`ModelClient.complete_streaming`) go through the same
client and the same error mapping. The SDK's typed chunks are not used
either: the Server-Sent Events are read here line by line, every chunk is
checked like a whole answer is, and a stream that breaks off, reports an
error or cannot be read is the provider's failure too.

Embeddings (`ModelClient.embed` for a turn's recall, `embed_many` for the
backfill) come from any OpenAI-compatible `POST /embeddings`: the chat
model's client (its connections and key shared) unless EMBEDDING_BASE_URL or
EMBEDDING_API_KEY name another provider, which then gets a client of its
own. The body is read the same way, every vector checked; any failure is
`EmbeddingUnavailable` (a turn answers without recall, the backfill retries
later). Each text is embedded as a `query` (the new message, searching) or
a `document` (what is stored), with EMBEDDING_QUERY_PREFIX or
EMBEDDING_DOCUMENT_PREFIX before it; `embedding_model` names the model
recorded with what is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, overload

from memchat.errors import UpstreamError, UpstreamTimeout
from memchat.model.sampling import DEFAULT as DEFAULT_SAMPLING
from memchat.model.sampling import Sampling
from memchat.sse_reader import Event, Item, SSEReader, UnknownLine

if TYPE_CHECKING:
    import httpx2 as httpx  # the HTTP library of the openai SDK (>= 3)
    import openai
    from openai import AsyncOpenAI

    from memchat.config import Settings

logger = logging.getLogger(__name__)

UNREADABLE = "The model provider sent an answer that could not be read; nothing was stored."
NO_ANSWER = "The model provider returned no answer; nothing was stored."
CUT_OFF = "The model provider's answer broke off before its end; nothing was stored."
STREAM_ERROR = "The model provider reported an error while answering; nothing was stored."

# What a text is embedded as: the message a turn searches with, or one stored.
EmbeddingKind = Literal["query", "document"]
# The model recorded for the offline responder's embeddings (`memchat dev`
# with no key): feature hashing (memchat.model.embeddings), whatever
# OPENAI_EMBEDDING_MODEL says, so they are never compared with a real model's.
OFFLINE_EMBEDDING_MODEL = "memchat-offline-hashing-v1"


class EmbeddingUnavailable(Exception):
    """No embedding for this text: the caller answers without recall.

    `reason` says what failed, for logs ("timeout", "HTTP 500", "the provider
    returned 1536 dimensions, ..."); it never holds the text or the vector.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text as the model wrote it (made storable)

    def parsed(self) -> dict[str, Any]:
        try:
            value = json.loads(self.arguments or "{}")
        except RecursionError:
            raise ValueError("tool arguments are nested too deeply") from None
        if not isinstance(value, dict):
            raise ValueError("tool arguments must be a JSON object")
        _check_fits_jsonb(value)
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
        # The offline responder embeds unless another provider is configured.
        offline = settings.offline_model and settings.embeddings_shared
        self.embedding_model = (
            OFFLINE_EMBEDDING_MODEL if offline else settings.openai_embedding_model
        )
        self._settings = settings
        self._http_client = http_client
        self._client: AsyncOpenAI | None = None
        # Embeddings' provider when it is not the chat model's (else None).
        self._provider: AsyncOpenAI | None = None
        self._embeddings_client: AsyncOpenAI | None = None
        self._batch_client: AsyncOpenAI | None = None
        # What embeddings are asked for as: base64 (float32 bytes: a quarter of
        # the floats' JSON, nothing to parse number by number) until a provider
        # refuses it, then plain floats for the process.
        self._embedding_encoding: Literal["base64", "float"] = "base64"

    @classmethod
    def for_settings(cls, settings: Settings) -> ModelClient:
        """The model the settings name; with `offline_model` (`memchat dev` with no
        key), the built-in offline responder, still through the real client."""
        http_client = None
        if settings.offline_model:
            from memchat.model import offline

            http_client = offline.http_client()
        return cls(settings, http_client=http_client)

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

    def _embeddings_provider(self) -> AsyncOpenAI:
        """The chat model's client (its HTTP connection pool and key shared),
        unless EMBEDDING_BASE_URL or EMBEDDING_API_KEY name another provider."""
        settings = self._settings
        if settings.embeddings_shared:
            return self._openai()
        if self._provider is None:
            from openai import AsyncOpenAI

            self._provider = AsyncOpenAI(
                # A local server that ignores keys still needs one sent.
                api_key=settings.embedding_api_key or settings.openai_api_key or "unused",
                base_url=settings.embedding_base_url or settings.openai_base_url,
                timeout=settings.embedding_timeout_seconds,
                max_retries=0,
            )
        return self._provider

    def _embedder(self) -> AsyncOpenAI:
        """The provider's client with the turn's embedding timeout and no
        retries: a slow or failing embedding only costs the turn its recall,
        never a wait for a retry."""
        if self._embeddings_client is None:
            self._embeddings_client = self._embeddings_provider().with_options(
                timeout=self._settings.embedding_timeout_seconds, max_retries=0
            )
        return self._embeddings_client

    def _batch_embedder(self) -> AsyncOpenAI:
        """The provider's client for the backfill's batches: the model call's
        timeout (OPENAI_TIMEOUT_SECONDS: a batch is many texts), no retries
        (the backfill backs off itself)."""
        if self._batch_client is None:
            self._batch_client = self._embeddings_provider().with_options(
                timeout=self._settings.openai_timeout_seconds, max_retries=0
            )
        return self._batch_client

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        allow_tools: bool = True,
        max_tokens: int | None = None,
        sampling: Sampling | None = None,
    ) -> Completion:
        """One chat completion; maps provider failures to 502/504 errors.

        The answer is at most `max_tokens` long (default OPENAI_MAX_TOKENS),
        sampled as the client chose (`sampling`, within OPENAI_MAX_TOKENS)."""
        request = self._chat_request(messages, tools, allow_tools, max_tokens, sampling)
        with _provider_errors():
            # The raw response: its body is read below, not by the SDK (see the
            # module docstring). Status errors, timeouts and retries are the SDK's.
            response = await self._post_chat(request)
            body = response.content
        with _readable():
            return _completion(body, self.model)

    async def complete_streaming(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        allow_tools: bool = True,
        on_delta: Callable[[str], Awaitable[None]] | None = None,
        sampling: Sampling | None = None,
    ) -> Completion:
        """One chat completion, streamed: `complete`'s answer, and its text as it comes.

        Every piece of the answer's text is awaited in `on_delta` as soon as
        its chunk arrives, made storable like the final content (the deltas
        join to exactly `Completion.content`). Tool calls, sent in fragments,
        are assembled; usage comes from the stream's last chunk.

        The same client, timeouts and retries as `complete` (the timeout bounds
        each read, so also the wait for the first token and between chunks),
        and the same errors: UpstreamTimeout, or UpstreamError for an HTTP
        error, a stream that breaks off, reports an error or cannot be read.
        A stream that fails once begun is not retried: its text was passed on.
        An exception of `on_delta` propagates as it is, the stream closed.
        """
        body = self._chat_request(messages, tools, allow_tools, None, sampling)
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        with _provider_errors():
            # Status errors (before the stream), timeouts and retries are the
            # SDK's; the body is read below, event by event.
            response = await self._post_chat(body, stream=True)
        try:
            with _readable():
                return await _streamed_completion(response, self.model, on_delta)
        finally:
            await response.aclose()

    async def _post_chat(self, body: dict[str, Any], *, stream: bool = False) -> httpx.Response:
        """POST /chat/completions through the SDK's client, answered with the
        HTTP response itself (read whole, or unread when `stream`).

        The SDK's own low-level `post` (its way to call any endpoint), not
        `chat.completions.create`: `create` first walks the whole request
        through its typed-dict transform, which for our plain JSON messages
        changes nothing and costs CPU time that grows with the context
        (docs/benchmarks.md, "Streamed answers"), paid on every turn before
        the request leaves. Authentication, timeouts, retries and the
        mapping of HTTP errors to exceptions are the same.
        """
        import httpx2

        client = self._openai()
        if stream:
            from openai import AsyncStream

            # With `cast_to` an HTTP response, the SDK returns it as it is (never
            # the `stream_cls` the signature asks for), its body not yet read.
            streamed: object = await client.post(
                "/chat/completions",
                cast_to=httpx2.Response,
                body=body,
                stream=True,
                stream_cls=AsyncStream[Any],
            )
            assert isinstance(streamed, httpx2.Response)
            return streamed
        return await client.post("/chat/completions", cast_to=httpx2.Response, body=body)

    def _chat_request(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        allow_tools: bool,
        max_tokens: int | None,
        sampling: Sampling | None = None,
    ) -> dict[str, Any]:
        cap = max_tokens or self._settings.openai_max_tokens
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            **(sampling or DEFAULT_SAMPLING).request_fields(cap),
        }
        if tools:
            kwargs["tools"] = tools
            kwargs["tool_choice"] = "auto" if allow_tools else "none"
        return kwargs

    async def embed(self, text: str, kind: EmbeddingKind) -> list[float]:
        """`text`'s embedding as a `kind`: `embedding_model`, EMBEDDING_DIMENSIONS floats.

        The vector is L2-normalised (length 1), so the cosine similarity of two
        of them is their dot product. One request, no retries, and the whole
        call (connecting, sending, reading the body) bounded by
        EMBEDDING_TIMEOUT_SECONDS. Every failure is `EmbeddingUnavailable`
        (logged as a warning with its reason, never the text).
        """
        settings = self._settings
        text = self._prefixed(text, kind)
        try:
            if not text.strip():
                raise EmbeddingUnavailable("the text is empty")
            (vector,) = await self._request(
                self._embedder(), text, 1, settings.embedding_timeout_seconds
            )
        except EmbeddingUnavailable as exc:
            logger.warning("embedding unavailable: %s", exc.reason, extra={"reason": exc.reason})
            raise
        return vector

    async def embed_many(self, texts: list[str], kind: EmbeddingKind) -> list[list[float]]:
        """The embeddings of `texts` as `kind`s, in their order: one request,
        or several in turn when they are more than a provider takes in one
        (EMBEDDING_REQUEST_INPUTS texts, EMBEDDING_REQUEST_CHARS characters).

        As `embed`, but each call is bounded by OPENAI_TIMEOUT_SECONDS (a batch
        is many texts; nobody waits for it); the provider's answers are put
        in the texts' order by their `index`. Every failure, a blank text
        among them included, is `EmbeddingUnavailable` (logged).
        """
        settings = self._settings
        inputs = [self._prefixed(text, kind) for text in texts]
        try:
            blank = next((i for i, text in enumerate(inputs) if not text.strip()), None)
            if blank is not None:
                raise EmbeddingUnavailable(f"text {blank} of the batch is empty")
            vectors: list[list[float]] = []
            for part in _request_parts(inputs):
                vectors += await self._request(
                    self._batch_embedder(), part, len(part), settings.openai_timeout_seconds
                )
            return vectors
        except EmbeddingUnavailable as exc:
            logger.warning(
                "embeddings unavailable: %s",
                exc.reason,
                extra={"reason": exc.reason, "texts": len(texts)},
            )
            raise

    def _prefixed(self, text: str, kind: EmbeddingKind) -> str:
        """`text` with its kind's prefix, made sendable (see `_safe_for_postgres`)."""
        settings = self._settings
        prefix = (
            settings.embedding_query_prefix
            if kind == "query"
            else settings.embedding_document_prefix
        )
        text = _safe_for_postgres(text)
        return prefix + text if text.strip() else text

    async def _request(
        self, client: AsyncOpenAI, inputs: str | list[str], count: int, seconds: float
    ) -> list[list[float]]:
        """POST /embeddings for `inputs`: `count` checked, normalised vectors."""
        import openai

        settings = self._settings
        try:
            # asyncio bounds the whole call: the SDK's timeout is per network
            # operation, so a server sending its body a byte at a time would
            # never trip it.
            async with asyncio.timeout(seconds):
                while True:
                    encoding = self._embedding_encoding
                    try:
                        response = await client.embeddings.with_raw_response.create(
                            input=inputs,
                            model=settings.openai_embedding_model,
                            dimensions=settings.embedding_dimensions,
                            encoding_format=encoding,
                        )
                    except openai.APIStatusError as exc:
                        if encoding != "base64" or not _refuses_base64(exc):
                            raise
                        # The SDK asks for base64 by default, so most servers
                        # answer it; this one does not: floats from now on.
                        logger.warning(
                            "embeddings: HTTP %s for base64; asking for floats",
                            exc.status_code,
                            extra={"status": exc.status_code},
                        )
                        self._embedding_encoding = "float"
                        continue
                    body = response.content
                    break
        except (openai.APITimeoutError, TimeoutError):
            raise EmbeddingUnavailable(f"timeout after {seconds:g} s") from None
        except openai.APIStatusError as exc:
            raise EmbeddingUnavailable(f"HTTP {exc.status_code}") from None
        except openai.APIConnectionError:
            raise EmbeddingUnavailable("connection error") from None
        except Exception as exc:
            # Recall is optional: nothing here may fail a turn. Only the type
            # is kept: an unexpected error's message could quote the text.
            raise EmbeddingUnavailable(f"unexpected {type(exc).__name__}") from None
        try:
            return _embeddings(body, settings.embedding_dimensions, count)
        except _Unreadable as exc:
            raise EmbeddingUnavailable(str(exc)) from None

    async def close(self) -> None:
        # These share the clients' HTTP connections.
        self._embeddings_client = self._batch_client = None
        if self._provider is not None:
            await self._provider.close()
            self._provider = None
        if self._client is not None:
            await self._client.close()
            self._client = None

    def reset(self) -> None:
        """Forget the SDK client (after a Lambda SnapStart restore).

        Its connection pool must not be shared by every instance restored
        from one snapshot: the next call builds a new client. Synchronous,
        for the runtime's hooks; the before-snapshot hook has already closed
        the client (`close()`), so no connection is dropped unclosed here.
        An HTTP client handed in (the offline responder's in-process
        transport) is kept.
        """
        self._embeddings_client = self._batch_client = None
        self._provider = None
        self._client = None


class _Unreadable(Exception):
    """The body is not a chat completion we can use; the message names the field."""


@contextlib.contextmanager
def _provider_errors() -> Iterator[None]:
    """The SDK's failures (status, timeout, connection) as 502/504 errors."""
    import openai

    try:
        yield
    except openai.APITimeoutError as exc:
        raise UpstreamTimeout() from exc
    except openai.APIStatusError as exc:
        raise UpstreamError(
            f"The model provider answered HTTP {exc.status_code}; nothing was stored."
        ) from exc
    except openai.APIError as exc:
        raise UpstreamError() from exc


@contextlib.contextmanager
def _readable() -> Iterator[None]:
    """An answer we cannot read is the provider's failure: 502, nothing stored."""
    try:
        yield
    except _Unreadable as exc:
        # Which field was wrong, never its value: it may be message text.
        logger.warning("model answer unreadable", extra={"reason": str(exc)})
        raise UpstreamError(UNREADABLE) from None


def _completion(body: bytes, default_model: str) -> Completion:
    """The completion in a 200 response body, every field used checked."""
    root = _object(_json(body), "body")
    choices = root.get("choices")
    if choices is None or choices == []:
        raise UpstreamError(NO_ANSWER)
    if not isinstance(choices, list):
        raise _Unreadable("choices is not a list")
    message = _object(_object(choices[0], "choices[0]").get("message"), "message")
    content = _string(message.get("content"), "message.content", default="")
    tool_calls = message.get("tool_calls")
    if tool_calls is None:
        tool_calls = []
    tool_calls = _list(tool_calls, "message.tool_calls")
    calls = [c for c in (_tool_call(item) for item in tool_calls) if c is not None]
    model = _string(root.get("model"), "model", default="") or default_model
    return Completion(content, calls, model, _usage(root.get("usage")))


async def _streamed_completion(
    response: httpx.Response,
    default_model: str,
    on_delta: Callable[[str], Awaitable[None]] | None,
) -> Completion:
    """The completion a 200 streamed response carries, each text delta passed on."""
    content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json" or content_type.endswith("+json"):
        # A server that ignores `stream` and answers with the whole completion.
        with _reading_errors():
            body = await response.aread()
        completion = _completion(body, default_model)
        if completion.content and on_delta is not None:
            await on_delta(completion.content)
        return completion
    stream = _Stream(default_model)
    events = _sse_events(response.aiter_bytes())
    try:
        while True:
            with _reading_errors():
                event = await anext(events, None)
            if event is None:
                break
            if event.data.strip() == b"[DONE]":
                stream.done = True
                await _drain(events)
                break
            text = stream.feed(event.name, event.data)
            # Passed on at once: a slow consumer slows the reading, nothing piles up.
            if text and on_delta is not None:
                await on_delta(text)
    finally:
        await events.aclose()
    tail = stream.finish()
    if tail and on_delta is not None:
        await on_delta(tail)
    return stream.completion()


_DRAIN_SECONDS = 0.1


async def _drain(events: AsyncIterator[object]) -> None:
    """Read what follows [DONE] (normally nothing but the body's end), briefly:
    a body read to its end lets the HTTP connection be used again."""
    with contextlib.suppress(Exception):  # the answer is whole: nothing here fails it
        async with asyncio.timeout(_DRAIN_SECONDS):
            async for _ in events:
                pass


@contextlib.contextmanager
def _reading_errors() -> Iterator[None]:
    """Failures while reading a 200 body: the stream broke (502) or stalled (504)."""
    import httpx2

    try:
        yield
    except _Unreadable:
        raise
    except httpx2.TimeoutException as exc:
        raise UpstreamTimeout() from exc
    except Exception as exc:
        # The connection dropped, a chunk was cut, TLS failed...: only the
        # type is logged (a message could quote the answer).
        logger.warning("model stream broke off", extra={"reason": type(exc).__name__})
        raise UpstreamError(CUT_OFF) from exc


async def _sse_events(chunks: AsyncIterator[bytes]) -> AsyncGenerator[Event, None]:
    """The Server-Sent Events of a byte stream (memchat.sse_reader), read strictly.

    A line that is no SSE field at all (HTML, bare JSON) is unreadable rather
    than ignored. An event the stream ends in without its blank line is still
    dispatched: a cut one fails as JSON.
    """
    reader = SSEReader()
    async for chunk in chunks:
        for event in _strict_events(reader.feed(chunk)):
            yield event
    for event in _strict_events(reader.flush()):
        yield event


def _strict_events(items: list[Item]) -> Iterator[Event]:
    for item in items:
        if isinstance(item, UnknownLine):
            raise _Unreadable("the stream holds a line that is not a server-sent event")
        if isinstance(item, Event):
            yield item


@dataclass
class _PartialCall:
    """A streamed tool call so far: OpenAI sends its id and name once, its
    arguments in pieces."""

    id: str | None = None
    name: str | None = None
    arguments: list[str] | None = None
    function: bool = False


class _Stream:
    """A streamed completion read chunk by chunk, every field used checked."""

    def __init__(self, default_model: str) -> None:
        self.done = False  # [DONE] was received
        self._default_model = default_model
        self._model = ""
        self._usage: dict[str, int] = {}
        self._content: list[str] = []
        self._held = ""  # a high surrogate whose low half may open the next chunk
        self._calls: dict[int, _PartialCall] = {}
        self._answered = False  # a chunk held a choice
        self._finished = False  # a choice had its finish_reason

    def feed(self, event: str, data: bytes) -> str:
        """Take one event; the storable text it adds to the answer ("" for none)."""
        if event == "error":
            raise self._failed()
        root = _object(_json(data), "chunk")
        if root.get("error") is not None:
            raise self._failed()
        model = _string(root.get("model"), "model", default="")
        if model:
            self._model = model
        if root.get("usage") is not None:
            self._usage = _usage(root["usage"])
        choices = root.get("choices")
        if choices is None or choices == []:
            return ""  # e.g. the usage chunk
        choice = _object(_list(choices, "choices")[0], "choices[0]")
        delta = choice.get("delta")
        delta = _object({} if delta is None else delta, "delta")
        if choice.get("finish_reason") is not None:
            _text(choice["finish_reason"], "finish_reason")
            self._finished = True
        self._answered = True
        tool_calls = delta.get("tool_calls")
        if tool_calls is not None:
            for position, fragment in enumerate(_list(tool_calls, "delta.tool_calls")):
                self._tool_call_fragment(position, fragment)
        return self._add(_text(delta.get("content"), "delta.content", default=""))

    def finish(self) -> str:
        """Check that the answer is whole; the storable text still held back."""
        if not self.done and not self._finished:
            # Neither [DONE] nor a finish_reason: the stream ended early.
            logger.warning("model stream broke off", extra={"reason": "no end of answer"})
            raise UpstreamError(CUT_OFF)
        if not self._answered:
            raise UpstreamError(NO_ANSWER)
        tail, self._held = _safe_for_postgres(self._held), ""
        if tail:
            self._content.append(tail)
        return tail

    def completion(self) -> Completion:
        calls = [
            ToolCall(
                id=_string(call.id, "tool call id"),
                name=_string(call.name, "tool call name"),
                arguments=_json_safe_for_postgres(
                    _safe_for_postgres("{}" if call.arguments is None else "".join(call.arguments))
                ),
            )
            for _, call in sorted(self._calls.items())
            if call.function  # other kinds of call carry no function
        ]
        return Completion(
            "".join(self._content), calls, self._model or self._default_model, self._usage
        )

    def _add(self, text: str) -> str:
        """`text` made storable, less a trailing high surrogate kept for the next
        piece: a surrogate pair split between two chunks is joined again."""
        text, self._held = self._held + text, ""
        if text and "\ud800" <= text[-1] <= "\udbff":
            text, self._held = text[:-1], text[-1]
        text = _safe_for_postgres(text)
        if text:
            self._content.append(text)
        return text

    def _tool_call_fragment(self, position: int, value: Any) -> None:
        fragment = _object(value, "tool call")
        index = fragment.get("index")
        if index is None:
            index = position  # a server that sends each call whole, unnumbered
        elif isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise _Unreadable("tool call index is not a count")
        call = self._calls.setdefault(index, _PartialCall())
        if fragment.get("id") is not None:
            call_id = _text(fragment["id"], "tool call id")
            if not call.id:
                call.id = call_id
        if fragment.get("function") is None:
            return
        function = _object(fragment["function"], "tool call function")
        call.function = True
        if function.get("name") is not None:
            name = _text(function["name"], "tool call name")
            if not call.name:
                call.name = name
        if function.get("arguments") is not None:
            piece = _text(function["arguments"], "arguments")
            call.arguments = [*(call.arguments or []), piece]

    @staticmethod
    def _failed() -> UpstreamError:
        # The provider's error message is not logged: it may quote the prompt.
        logger.warning("model stream reported an error", extra={"reason": "error event"})
        return UpstreamError(STREAM_ERROR)


def _embeddings(body: bytes, dimensions: int, count: int) -> list[list[float]]:
    """The `count` embeddings in a 200 response body, checked and L2-normalised,
    in the order of the inputs (by each item's `index`; without indices, as sent)."""
    root = _object(_json(body), "body")
    data = _list(root.get("data"), "data")
    if not data:
        raise _Unreadable("data is empty")
    if len(data) != count:
        raise _Unreadable(f"data holds {len(data)} embeddings for {count} texts")
    items = [_object(item, f"data[{i}]") for i, item in enumerate(data)]
    indices = [item.get("index") for item in items]
    # bool is an int in Python, not an index.
    numbered = [i for i in indices if isinstance(i, int) and not isinstance(i, bool)]
    if all(index is None for index in indices):
        order = list(range(count))
    elif len(numbered) == count and sorted(numbered) == list(range(count)):
        order = numbered
    else:
        raise _Unreadable("data's indices do not number the texts")
    vectors: list[list[float]] = [[] for _ in range(count)]
    for position, item in zip(order, items, strict=True):
        vectors[position] = _vector(item.get("embedding"), f"data[{position}]", dimensions)
    return vectors


def _refuses_base64(error: openai.APIStatusError) -> bool:
    """Whether an embeddings request's 4xx refuses its `encoding_format`
    (the answer names the field or the value), not its input."""
    if error.status_code not in (400, 422):
        return False
    body = error.response.text.lower()
    return "encoding_format" in body or "base64" in body


def _vector(value: Any, where: str, dimensions: int) -> list[float]:
    """One embedding of `dimensions` finite numbers, L2-normalised: a list of
    JSON numbers, or a base64 string of float32s."""
    # Imported here, like the SDK: most cold starts never embed.
    from memchat.model.embeddings import normalised

    if isinstance(value, str):
        values = _base64_floats(value, where)
    else:
        values = [_coordinate(number, where) for number in _list(value, f"{where}.embedding")]
    if not values:
        raise _Unreadable(f"{where}.embedding is empty")
    if len(values) != dimensions:
        # A provider or model that ignores `dimensions` (or a changed setting).
        raise _Unreadable(
            f"the provider returned {len(values)} dimensions but EMBEDDING_DIMENSIONS is"
            f" {dimensions} (does OPENAI_EMBEDDING_MODEL honour `dimensions`?)"
        )
    if not all(map(math.isfinite, values)):  # NaN, Infinity, 1e400
        raise _Unreadable(f"{where}.embedding holds a non-finite number")
    unit = normalised(values)
    if unit is None:
        raise _Unreadable(f"{where}.embedding is all zeros")
    return unit


def _coordinate(number: Any, where: str) -> float:
    """A JSON number as a float (inf when too large for one)."""
    # bool is an int in Python, not a coordinate.
    if isinstance(number, bool) or not isinstance(number, int | float):
        raise _Unreadable(f"{where}.embedding holds something other than numbers")
    try:
        return float(number)  # a JSON integer may be too large for a float
    except OverflowError:
        return math.inf


def _base64_floats(value: str, where: str) -> list[float]:
    """An embedding sent as base64 (what `encoding_format: base64` asks for):
    little-endian float32s."""
    import array
    import base64
    import binascii
    import sys

    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise _Unreadable(f"{where}.embedding is neither numbers nor base64") from None
    if len(raw) % 4:
        raise _Unreadable(f"{where}.embedding is not float32s ({len(raw)} bytes)")
    floats = array.array("f", raw)
    if sys.byteorder != "little":
        floats.byteswap()
    return floats.tolist()


def _tool_call(value: Any) -> ToolCall | None:
    """A function call; None for other kinds of call (they carry no function)."""
    call = _object(value, "tool call")
    if call.get("function") is None:
        return None
    function = _object(call["function"], "tool call function")
    return ToolCall(
        id=_string(call.get("id"), "tool call id"),
        name=_string(function.get("name"), "tool call name"),
        arguments=_json_safe_for_postgres(
            _string(function.get("arguments"), "arguments", default="{}")
        ),
    )


def _usage(value: Any) -> dict[str, int]:
    if value is None:
        return {}
    usage = _object(value, "usage")
    counts = {}
    for key in ("prompt_tokens", "completion_tokens"):
        count = usage.get(key)
        if count is None:
            count = 0
        # bool is an int in Python, not a token count.
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise _Unreadable(f"usage.{key} is not a count")
        counts[key] = count
    return counts


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)  # bytes: UTF-8/16/32 detected; invalid is a ValueError
    except (ValueError, RecursionError):
        raise _Unreadable("body is not JSON") from None


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _Unreadable(f"{where} is not a list")
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Unreadable(f"{where} is not an object")
    return value


def _string(value: Any, where: str, *, default: str | None = None) -> str:
    """A string field, made storable; null or absent only when there is a default."""
    return _safe_for_postgres(_text(value, where, default=default))


def _text(value: Any, where: str, *, default: str | None = None) -> str:
    """A string field as it is (a piece of a streamed one: made storable once joined)."""
    if value is None and default is not None:
        return default
    if not isinstance(value, str):
        raise _Unreadable(f"{where} is not a string")
    return value


_SURROGATE = re.compile("[\ud800-\udfff]")


@overload
def _safe_for_postgres(value: str) -> str: ...
@overload
def _safe_for_postgres(value: object) -> object: ...
def _safe_for_postgres(value: object) -> object:
    """`value` with every string made storable in PostgreSQL text and jsonb.

    NUL is removed: neither type can hold it, and it carries no meaning. Lone
    UTF-16 surrogates (JSON may escape one, "\\ud800", but it is no character)
    become U+FFFD: they cannot be encoded as UTF-8, so psycopg would fail the
    turn when it is stored. A surrogate pair split in two is joined again.
    """
    if isinstance(value, str):
        value = value.replace("\x00", "")
        if _SURROGATE.search(value):
            value = value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        return value
    if isinstance(value, list):
        return [_safe_for_postgres(v) for v in value]
    if isinstance(value, dict):
        return {_safe_for_postgres(k): _safe_for_postgres(v) for k, v in value.items()}
    return value


# JSON escapes that decode to something `_safe_for_postgres` changes: NUL or a surrogate.
_UNSAFE_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")


def _json_safe_for_postgres(text: str) -> str:
    """JSON text (tool-call arguments) whose decoded strings are storable too.

    `text` itself has been through `_safe_for_postgres`; escapes can still decode to
    NUL or a lone surrogate, so such text is decoded, repaired and written
    again. Text that is not JSON is left as it is (it is stored as a string).
    """
    if not _UNSAFE_ESCAPE.search(text):
        return text
    try:
        value = json.loads(text)
        repaired = _safe_for_postgres(value)
        if repaired == value:
            return text
        return json.dumps(repaired, ensure_ascii=False)
    except (ValueError, RecursionError):
        # Not JSON, or nested too deeply to walk: ToolCall.parsed refuses it
        # and it is stored as a string, which holds the escapes as they are.
        return text


_MAX_ARGUMENT_DEPTH = 64


def _check_fits_jsonb(value: Any) -> None:
    """Refuse parsed arguments that would fail the turn when stored as jsonb.

    json.loads accepts NaN and Infinity (and 1e400 parses as inf), which jsonb
    cannot hold; and deeply nested values would exhaust the recursion of
    whatever walks them next (our sanitizer, psycopg's json.dumps). Walked
    without recursion for that reason.
    """
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > _MAX_ARGUMENT_DEPTH:
            raise ValueError("tool arguments are nested too deeply")
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError("tool arguments must hold finite numbers")
        if isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())


# What one embeddings request holds at most: OpenAI takes 2,048 inputs and
# 300,000 tokens a request (memchat.model.embedding_server a 2 MiB total).
EMBEDDING_REQUEST_INPUTS = 2048
EMBEDDING_REQUEST_CHARS = 1_000_000


def _request_parts(inputs: list[str]) -> list[list[str]]:
    """`inputs` in order, in parts of at most EMBEDDING_REQUEST_INPUTS texts
    and EMBEDDING_REQUEST_CHARS characters (a longer text alone)."""
    from memchat.packing import packed

    return list(packed(inputs, len, EMBEDDING_REQUEST_CHARS, count=EMBEDDING_REQUEST_INPUTS))
