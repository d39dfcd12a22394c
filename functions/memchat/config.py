"""Settings: one object read from the environment, validated at start.

A missing or placeholder value fails with a message that names the variable,
so a misconfigured Lambda dies at init with a readable log line instead of
answering 500s.

One settings object, narrowed per function: ROUTE_GROUPS names the route
groups a process serves (`chat`, `sessions`, `export`; all of them by default,
as with `memchat dev` and in the tests). Only a process that serves chat needs
OPENAI_API_KEY (a deployed sessions or export function is not given it), and
`create_app` includes only the served groups' routes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

AGENT_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
# MEMORY_RECALL_DUPLICATE_SCORE's default, for recall called without settings
# (memchat.store.embeddings.recall).
DUPLICATE_SCORE = 0.95

# The routes an HTTP process serves (ROUTE_GROUPS), one group per function
# in template.yaml: chat = POST /chat; sessions = clear-session, sessions,
# memory, stats, feedback and account; export = the two exports (GET /health
# is always served with any of those).
RouteGroup = Literal["chat", "sessions", "export"]
ROUTE_GROUPS: tuple[RouteGroup, ...] = get_args(RouteGroup)
# A scheduled job's process serves no routes: the rolling summary worker
# (calls the model), the TTL cleanup (DATABASE_URL alone).
Job = Literal["summaries", "cleanup"]

# How fact keys are made (MEMORY_RECALL_FACTS), and the yes/no spellings
# taken for `rule` and `off` (pydantic's for a bool: the setting was one).
FactsMode = Literal["rule", "model", "off"]
_FACTS_MODE_WORDS = {
    **dict.fromkeys(("1", "on", "t", "true", "y", "yes"), "rule"),
    **dict.fromkeys(("0", "f", "false", "n", "no"), "off"),
}

# Whole values that are never a real secret (compared lowercased, unquoted).
_PLACEHOLDER_VALUES = frozenset(
    {
        "changeme", "change-me", "change_me", "changethis", "change-this", "change_this",
        "changeit", "secret", "password", "key", "apikey", "api-key", "api_key", "token",
        "your-secret", "your_secret", "yoursecret", "your-key", "your_key", "yourkey",
        "your-api-key", "your_api_key", "yourapikey", "todo", "tbd", "fixme", "placeholder",
        "example", "dummy", "fake", "none", "null", "nil", "undefined", "empty", "na", "n/a",
        "unset", "not-set", "notset", "redacted",
    }
)  # fmt: skip
# Words that give a template's "sk-your-key-here" or "<replace-me>" away.
_PLACEHOLDER_WORDS = frozenset(
    {"your", "yours", "changeme", "changethis", "placeholder", "redacted", "fixme", "todo"}
)
# Unexpanded references: ${VAR}, $VAR, {{ var }}, <your key>, %VAR%.
_REFERENCE = re.compile(r"\$\{|^\$\w|\{\{|<[^>]*>|^%\w+%$")
_KEY_PREFIX = re.compile(r"^sk-(?:proj-|ant-|svcacct-)?")


class ConfigError(RuntimeError):
    """The environment does not describe a runnable service."""


def is_placeholder(value: str, variable: str) -> bool:
    """Whether a secret's value is a stand-in left in place of the real one.

    The one rule for every secret (OPENAI_API_KEY, SUPABASE_JWT_SECRET):
    `changeme`, `<your-key>`, `your-api-key`, `sk-...`, `xxx`, `sk-xxxx`,
    `${OPENAI_API_KEY}`, the variable's own name, quotes around nothing, and
    the like. Real keys and secrets are random strings and never match.
    """
    text = value.strip().strip("'\"`").strip()
    lowered = text.lower()
    if not re.search(r"[a-z0-9]", lowered):  # "", '""', "-", "***", "..."
        return True
    if lowered in _PLACEHOLDER_VALUES or lowered == variable.lower():
        return True
    if "..." in text or "\u2026" in text or _REFERENCE.search(text):
        return True
    # Filler: one character repeated, after a key prefix ("xxx", "sk-xxxx-xxxx", "0000").
    if len(set(re.sub(r"[-_\s]", "", _KEY_PREFIX.sub("", lowered)))) <= 1:
        return True
    return bool(_PLACEHOLDER_WORDS & set(re.split(r"[^a-z0-9]+", lowered)))


def parse_route_groups(value: object) -> frozenset[RouteGroup]:
    """ROUTE_GROUPS as a set: a comma-separated string or an iterable; None is
    every group (the whole API, as `memchat dev` and the tests serve it)."""
    if value is None:
        return frozenset(ROUTE_GROUPS)
    if isinstance(value, str):
        names = [name.strip().lower() for name in value.split(",") if name.strip()]
    elif isinstance(value, Iterable):
        names = [str(name).strip().lower() for name in value]
    else:
        raise ValueError("must be a comma-separated list of chat, sessions, export")
    unknown = sorted(set(names) - set(ROUTE_GROUPS))
    if unknown:
        raise ValueError(
            f"unknown route group {', '.join(map(repr, unknown))}: use chat, sessions, export"
        )
    if not names:
        raise ValueError("name at least one of chat, sessions, export")
    return frozenset(name for name in ROUTE_GROUPS if name in names)


def secret_settings(route_groups: Iterable[str], job: Job | None = None) -> tuple[str, ...]:
    """The secret settings a process reads: one serving these route groups, or
    running `job` (then it serves none).

    Every process connects to the database; the HTTP functions check tokens;
    only chat and the summary worker (which also runs the embedding backfill)
    call the model and make embeddings, so only they read OPENAI_API_KEY and
    EMBEDDING_API_KEY.
    """
    groups = set() if job else set(route_groups)
    names: tuple[str, ...] = ("database_url",)
    if groups:
        names += ("supabase_jwt_secret",)
    if "chat" in groups or job == "summaries":
        names += ("openai_api_key", "embedding_api_key")
    return names


class Settings(BaseModel):
    """Every setting, one field each; its variable is the field's name in capitals.

    Read with `load_settings()` (the environment, names matched without
    regard to case, plus overrides), so each value arrives as the string the
    environment holds and the validators below parse it: a plain pydantic
    model, as pydantic-settings would add nothing here but its import time.
    """

    model_config = ConfigDict(extra="ignore", validate_default=True)

    # What this process serves (template.yaml gives each function its own).
    route_groups: frozenset[RouteGroup] = frozenset(ROUTE_GROUPS)
    # A scheduled job's process (its handler says which): then no route group.
    job: Job | None = None

    database_url: str = Field(min_length=1)
    supabase_url: str | None = None
    supabase_jwt_secret: str | None = None

    openai_api_key: str | None = None
    openai_base_url: str | None = None
    openai_model: str = "gpt-4o-mini"
    openai_timeout_seconds: float = Field(default=60.0, gt=0)
    openai_max_retries: int = Field(default=2, ge=0, le=10)
    # The longest answer one model call may write (`max_tokens`), so no
    # request can spend the model budget without bound.
    openai_max_tokens: int = Field(default=2048, ge=16, le=200_000)
    # The whole model conversation of a turn (all tool rounds and retries):
    # API Gateway gives up after 30 s, so answer 504 before it does.
    turn_timeout_seconds: float = Field(default=25.0, gt=0)
    # A streamed turn (POST /chat as Server-Sent Events) sends a `: keep-alive`
    # comment after this many seconds without an event, so proxies and
    # browsers do not close a connection the model is silent on.
    stream_keepalive_seconds: float = Field(default=10.0, gt=0, le=300)
    # `memchat dev` with no key answers from the built-in offline responder.
    offline_model: bool = False

    memory_enabled: bool = True
    memory_max_history_messages: int = Field(default=10, ge=1, le=50)
    memory_max_context_chars: int = Field(default=24000, ge=1000)
    # What memory may add to a prompt (notes, recalled exchanges, the window),
    # counted with the model's tokenizer (memchat.model.tokens).
    memory_max_context_tokens: int = Field(default=4000, ge=100, le=1_000_000)
    # Recall: earlier user messages of the same agent, found by meaning.
    memory_recall_k: int = Field(default=3, ge=0, le=10)
    # Cosine similarity below which a recalled message is dropped.
    memory_recall_min_score: float = Field(default=0.3, ge=-1, le=1)
    # A recalled message at least this similar to a better one is the same
    # memory said twice: only the better is kept. Per model, as the floor:
    # all-MiniLM-L6-v2 scores unrelated texts far lower than e5 models, which
    # want 1, only identical ones (docs/benchmarks.md, "Another local model").
    # Lower, it also collapses a fact with its update, "I have 3 bikes" and
    # later "I have 4 bikes", which the model needs both of, with their dates.
    memory_recall_duplicate_score: float = Field(default=DUPLICATE_SCORE, ge=0, le=1)
    # Recall also finds rounds (a message with its answer) by the message's
    # words (Postgres full text), fused with the nearest by meaning.
    memory_recall_words: bool = True
    # A time expression in the message ("last week") adds that period's
    # nearest to recall's candidates (memchat.usecases.recall.periods).
    memory_recall_time: bool = True
    # Fact keys, made by the embedding backfill: `rule` (also 1) gives a
    # message that says several things a recall key per sentence about the
    # user (memchat.usecases.recall.facts.fact_sentences: about 1.5 more embeddings per user
    # message); `model` asks the chat model for the facts each message states
    # (one chat request per session's new messages, up to 16); `off` (also 0):
    # none are made.
    memory_recall_facts: FactsMode = "rule"
    # Offer the model the search_memory tool (model/search_tool.py) on every
    # turn (POST /chat and POST /v1/chat/completions); a request's own
    # `search_memory` (/v1: `memchat.search_memory`) decides for itself.
    search_memory_tool: bool = False
    # Suggested follow-ups with every answer (POST /chat and /v1; a request's
    # `suggest`, /v1 `memchat.suggest`, decides for itself): up to three
    # questions the user might send next, one more model call a turn, never
    # stored (usecases/suggestions.py).
    suggestions: bool = False
    # Embeddings come from any OpenAI-compatible `POST /embeddings`: this
    # model (recorded with every stored embedding: vectors of different
    # models are never compared), at EMBEDDING_BASE_URL with EMBEDDING_API_KEY
    # (both default to the chat model's: OPENAI_BASE_URL, OPENAI_API_KEY).
    openai_embedding_model: str = Field(default="text-embedding-3-small", min_length=1)
    embedding_base_url: str | None = None
    embedding_api_key: str | None = None
    # The stored column's size (supabase/schemas/functions/recall.sql: vector(512)); checked
    # at start (`memchat db reembed --dimensions N` changes it).
    embedding_dimensions: int = Field(default=512, ge=1, le=16000)
    # Put before the text embedded: a search's (the new message, recalling)
    # and a stored message's. e5 models want "query: " and "passage: ".
    embedding_query_prefix: str = ""
    embedding_document_prefix: str = ""
    # An embedding slower than this is given up: the turn answers without recall.
    embedding_timeout_seconds: float = Field(default=2.0, gt=0, le=60)
    # Messages per embeddings request of the backfill (usecases/backfill.py).
    embedding_batch_size: int = Field(default=64, ge=1, le=2048)

    # Rolling summaries (usecases/summarize.py): a session becomes due once
    # this many messages beyond its window are not in its summary yet.
    summary_trigger_messages: int = Field(default=10, ge=1, le=10_000)
    # The summary's length, counted with the model's tokenizer.
    summary_max_tokens: int = Field(default=400, ge=50, le=8000)
    # Messages fed to one refresh at most (a backlog takes several refreshes).
    summary_chunk_messages: int = Field(default=100, ge=2, le=2000)
    # A session whose summary failed this many times in a row is skipped until
    # its next turn (logged and counted).
    summary_max_attempts: int = Field(default=5, ge=1, le=100)
    # Sessions claimed per worker round.
    summary_batch_size: int = Field(default=20, ge=1, le=1000)
    # At most this many summaries a second: with a real model the worker
    # hardly reaches it; with a very fast one it keeps the worker from
    # crowding out the chat turns (docs/benchmarks.md, "Rolling summaries").
    # 0: no cap.
    summary_max_per_second: float = Field(default=5.0, ge=0, le=10_000)
    session_ttl_hours: float = Field(default=168, gt=0)
    # How long what memory keeps of a session (memchat.memories) outlives it:
    # days past the session's expiry (0: it goes with the session).
    memory_retention_days: int = Field(default=365, ge=0, le=36500)
    # The scheduled cleanup (usecases/cleanup.py): sessions deleted per batch,
    # and where its adaptive pause between batches starts, in batch durations
    # (0: no pause).
    cleanup_batch_size: int = Field(default=1000, ge=1, le=100000)
    cleanup_pause_factor: float = Field(default=1.0, ge=0, le=100)
    # A new message sent to the model (POST /chat, the last user message of
    # /v1): 413 beyond. An imported message is only stored: it may be longer,
    # up to IMPORT_MAX_MESSAGE_CHARS (and the database's max_message_bytes).
    max_message_chars: int = Field(default=16000, ge=1)
    import_max_message_chars: int = Field(default=200_000, ge=1, le=10_000_000)
    # All the client's text one POST /v1/chat/completions sends to the model
    # (its messages, tool calls and results, tool schemas): 413 beyond, the
    # model not called. Each message is held to MAX_MESSAGE_CHARS too.
    max_request_chars: int = Field(default=64_000, ge=1, le=10_000_000)
    # The most messages one user's live sessions may hold (the database holds
    # its own copy, memchat.limits.max_stored_messages; the lower holds): a
    # write past it (a turn, an import) is refused whole, 413 quota_exceeded.
    user_max_stored_messages: int = Field(default=100_000, ge=1, le=10**15)
    ltm_max_chars: int = Field(default=8000, ge=100)
    max_tool_rounds: int = Field(default=4, ge=1, le=16)

    # Per-user chat throttle, a token bucket kept in Postgres (checked in the
    # same round trip that loads a turn's context): CHAT_RATE_PER_MINUTE turns
    # a minute on average, up to CHAT_RATE_BURST at once. 0 disables it.
    chat_rate_per_minute: float = Field(default=20, ge=0, le=100_000)
    chat_rate_burst: int = Field(default=10, ge=1, le=100_000)
    # The same for every other write and costly read, one bucket per kind
    # (memchat.throttle says which request uses which): notes, clear-session
    # and feedback; one session's export (the chat page reloads with it) and
    # the stats; the whole account's export; and DELETE /me (a few an hour).
    write_rate_per_minute: float = Field(default=60, ge=0, le=100_000)
    write_rate_burst: int = Field(default=30, ge=1, le=100_000)
    read_rate_per_minute: float = Field(default=60, ge=0, le=100_000)
    read_rate_burst: int = Field(default=30, ge=1, le=100_000)
    export_rate_per_minute: float = Field(default=6, ge=0, le=100_000)
    export_rate_burst: int = Field(default=3, ge=1, le=100_000)
    erase_rate_per_minute: float = Field(default=0.1, ge=0, le=100_000)
    erase_rate_burst: int = Field(default=2, ge=1, le=100_000)
    # History imports (POST /sessions/import): one token per request, whatever
    # it holds; `memchat import` waits out a 429 and goes on.
    import_rate_per_minute: float = Field(default=6, ge=0, le=100_000)
    import_rate_burst: int = Field(default=10, ge=1, le=100_000)
    # What one import request may hold (413 beyond, naming the limit): its
    # body (every other request's is capped at 1 MB; `memchat import` splits a
    # larger file into requests), its sessions, and any one session's messages
    # (a session is stored in one transaction, so this bounds a transaction).
    import_max_bytes: int = Field(default=30_000_000, ge=1_000_000, le=1_000_000_000)
    import_max_sessions: int = Field(default=1000, ge=1, le=100_000)
    import_max_messages_per_session: int = Field(default=10_000, ge=1, le=1_000_000)
    # Supabase anonymous sign-ins (is_anonymous: true) carry role=authenticated
    # too; they are refused (401) unless this is set.
    allow_anonymous_users: bool = False

    cors_allow_origins: list[str] = Field(default_factory=list)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    # Connections held by one process: 1 in Lambda (one request at a time).
    db_max_connections: int = Field(default=1, ge=1, le=100)
    # Set in every request's transaction, so one bad request can hold neither
    # a statement nor an open transaction (an export to a reader that stalls)
    # without bound. The login roles carry looser ones as a floor (migration
    # supabase/schemas/functions/limits.sql).
    db_statement_timeout_ms: int = Field(default=15_000, ge=100, le=600_000)
    db_idle_in_transaction_timeout_ms: int = Field(default=60_000, ge=100, le=3_600_000)

    @field_validator(
        "supabase_url",
        "supabase_jwt_secret",
        "openai_api_key",
        "openai_base_url",
        "embedding_api_key",
        "embedding_base_url",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # Deployment templates pass "" for a parameter left blank: that means unset.
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("cors_allow_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: object) -> object:
        if isinstance(value, str):
            return [origin.strip() for origin in value.split(",") if origin.strip()]
        return value

    @field_validator("route_groups", mode="before")
    @classmethod
    def _parse_route_groups(cls, value: object) -> object:
        return parse_route_groups(value)

    @field_validator("memory_recall_facts", mode="before")
    @classmethod
    def _facts_mode(cls, value: object) -> object:
        if isinstance(value, bool):
            return "rule" if value else "off"
        if isinstance(value, str):
            lowered = value.strip().lower()
            return _FACTS_MODE_WORDS.get(lowered, lowered)
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("supabase_url")
    @classmethod
    def _strip_slash(cls, value: str | None) -> str | None:
        return value.rstrip("/") if value else None

    @model_validator(mode="after")
    def _check_secrets(self) -> Settings:
        if self.job is not None:
            self.route_groups = frozenset()
        if self.route_groups and not self.supabase_jwt_secret and not self.supabase_url:
            raise ValueError(
                "set SUPABASE_JWT_SECRET (HS256 projects) or SUPABASE_URL (JWKS signing keys)"
            )
        secret = self.supabase_jwt_secret
        if secret is not None and (
            is_placeholder(secret, "SUPABASE_JWT_SECRET") or len(secret) < 32
        ):
            raise ValueError("SUPABASE_JWT_SECRET must be the project's JWT secret (>= 32 chars)")
        if not self.calls_model:
            # Narrowed: a process that never calls the model never holds its keys.
            self.openai_api_key = self.embedding_api_key = None
            return self
        key = self.openai_api_key
        if key is None and not self.offline_model:
            raise ValueError("set OPENAI_API_KEY (or run `memchat dev` for the offline responder)")
        for variable, value in (
            ("OPENAI_API_KEY", key),
            ("EMBEDDING_API_KEY", self.embedding_api_key),
        ):
            if value is not None and is_placeholder(value, variable):
                raise ValueError(
                    f"{variable} looks like a placeholder, not an API key: set the real key"
                    " (a server that ignores keys still needs a real-looking value, e.g. 'local')"
                )
        return self

    def serves(self, group: RouteGroup) -> bool:
        """Whether this process serves the route group (ROUTE_GROUPS)."""
        return group in self.route_groups

    @property
    def calls_model(self) -> bool:
        """Whether this process talks to the model (and so holds OPENAI_API_KEY)."""
        return self.serves("chat") or self.job == "summaries"

    @property
    def embeddings_shared(self) -> bool:
        """Whether embeddings come from the chat model's provider (EMBEDDING_BASE_URL
        and EMBEDDING_API_KEY unset, or the same as OPENAI_BASE_URL and OPENAI_API_KEY)."""
        url, key = self.embedding_base_url, self.embedding_api_key
        return url in (None, self.openai_base_url) and key in (None, self.openai_api_key)

    @property
    def jwt_issuer(self) -> str | None:
        return f"{self.supabase_url}/auth/v1" if self.supabase_url else None

    @property
    def jwks_url(self) -> str | None:
        return f"{self.supabase_url}/auth/v1/.well-known/jwks.json" if self.supabase_url else None


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        name = "_".join(str(p) for p in item["loc"]).upper()
        message = re.sub(r"^Value error, ", "", item["msg"])
        parts.append(f"{name}: {message}" if name else message)
    return "; ".join(parts)


def environment_values() -> dict[str, str]:
    """The settings the environment sets, by field name (DATABASE_URL: database_url)."""
    fields = Settings.model_fields
    return {name.lower(): value for name, value in os.environ.items() if name.lower() in fields}


def load_settings(**overrides: object) -> Settings:
    """Read the settings from the environment, overrides first, raising
    ConfigError that names each bad variable."""
    try:
        return Settings.model_validate({**environment_values(), **overrides})
    except ValidationError as exc:
        raise ConfigError(f"invalid configuration: {_describe(exc)}") from None
