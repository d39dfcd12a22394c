"""Settings: one object read from the environment, validated at start.

A missing or placeholder value fails with a message that names the variable,
so a misconfigured Lambda dies at init with a readable log line instead of
answering 500s.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

AGENT_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
_PLACEHOLDERS = {"changeme", "change-me", "changethis", "secret", "your-secret", "xxx"}


class ConfigError(RuntimeError):
    """The environment does not describe a runnable service."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_file=None, extra="ignore", case_sensitive=False)

    database_url: str = Field(min_length=1)
    supabase_url: str | None = None
    supabase_jwt_secret: str | None = None

    openai_api_key: str | None = None
    openai_base_url: str | None = None
    openai_model: str = "gpt-4o-mini"
    openai_timeout_seconds: float = Field(default=60.0, gt=0)
    openai_max_retries: int = Field(default=2, ge=0, le=10)
    # The whole model conversation of a turn (all tool rounds and retries):
    # API Gateway gives up after 30 s, so answer 504 before it does.
    turn_timeout_seconds: float = Field(default=25.0, gt=0)
    # `memchat dev` with no key answers from the built-in offline responder.
    offline_model: bool = False

    memory_enabled: bool = True
    memory_max_history_messages: int = Field(default=10, ge=1, le=50)
    memory_max_context_chars: int = Field(default=24000, ge=1000)
    session_ttl_hours: float = Field(default=168, gt=0)
    cleanup_batch_size: int = Field(default=1000, ge=1, le=100000)
    max_message_chars: int = Field(default=16000, ge=1)
    ltm_max_chars: int = Field(default=8000, ge=100)
    max_tool_rounds: int = Field(default=4, ge=1, le=16)

    cors_allow_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    # Connections held by one process: 1 in Lambda (one request at a time).
    db_max_connections: int = Field(default=1, ge=1, le=100)

    @field_validator(
        "supabase_url", "supabase_jwt_secret", "openai_api_key", "openai_base_url", mode="before"
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
        if not self.supabase_jwt_secret and not self.supabase_url:
            raise ValueError(
                "set SUPABASE_JWT_SECRET (HS256 projects) or SUPABASE_URL (JWKS signing keys)"
            )
        secret = self.supabase_jwt_secret
        if secret is not None and (secret.lower() in _PLACEHOLDERS or len(secret) < 32):
            raise ValueError("SUPABASE_JWT_SECRET must be the project's JWT secret (>= 32 chars)")
        if not self.openai_api_key and not self.offline_model:
            raise ValueError("set OPENAI_API_KEY (or run `memchat dev` for the offline responder)")
        return self

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


def load_settings(**overrides: object) -> Settings:
    """Read the settings, raising ConfigError that names each bad variable."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise ConfigError(f"invalid configuration: {_describe(exc)}") from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load_settings()
