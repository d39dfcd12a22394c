"""Settings (memchat.config): read from the environment, refused early and clearly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from memchat.config import ConfigError, Settings, get_settings, load_settings

SECRET = "s" * 40


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Only what a test sets counts: no setting leaks in from the shell."""
    for name in Settings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture
def minimal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://localhost/memchat")
    monkeypatch.setenv("SUPABASE_JWT_SECRET", SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")


def test_documented_defaults(minimal: None) -> None:
    settings = load_settings()
    assert settings.memory_enabled is True
    assert settings.memory_max_history_messages == 10
    assert settings.session_ttl_hours == 168
    assert settings.cleanup_batch_size == 1000
    assert settings.max_message_chars == 16000
    assert settings.ltm_max_chars == 8000
    assert settings.cors_allow_origins == []
    assert settings.log_level == "INFO"
    assert settings.supabase_url is None and settings.jwks_url is None
    assert settings.jwt_issuer is None


def test_environment_values_are_parsed(minimal: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORY_ENABLED", "0")
    monkeypatch.setenv("MEMORY_MAX_HISTORY_MESSAGES", "25")
    monkeypatch.setenv("SESSION_TTL_HOURS", "1.5")
    monkeypatch.setenv("CORS_ALLOW_ORIGINS", "https://a.example, https://b.example,,")
    monkeypatch.setenv("LOG_LEVEL", "debug")
    monkeypatch.setenv("SUPABASE_URL", "https://proj.supabase.co/")
    settings = load_settings()
    assert settings.memory_enabled is False
    assert settings.memory_max_history_messages == 25
    assert settings.session_ttl_hours == 1.5
    assert settings.cors_allow_origins == ["https://a.example", "https://b.example"]
    assert settings.log_level == "DEBUG"
    assert settings.supabase_url == "https://proj.supabase.co"
    assert settings.jwt_issuer == "https://proj.supabase.co/auth/v1"
    assert settings.jwks_url == "https://proj.supabase.co/auth/v1/.well-known/jwks.json"


def test_get_settings_reads_once(minimal: None, monkeypatch: pytest.MonkeyPatch) -> None:
    first = get_settings()
    monkeypatch.setenv("LOG_LEVEL", "ERROR")
    assert get_settings() is first


@pytest.mark.parametrize(
    ("missing", "named"),
    [
        ("DATABASE_URL", "DATABASE_URL"),
        ("OPENAI_API_KEY", "OPENAI_API_KEY"),
        ("SUPABASE_JWT_SECRET", "SUPABASE_JWT_SECRET"),
    ],
)
def test_a_missing_required_setting_is_named(
    minimal: None, monkeypatch: pytest.MonkeyPatch, missing: str, named: str
) -> None:
    monkeypatch.delenv(missing)
    with pytest.raises(ConfigError, match=named):
        load_settings()


def test_supabase_url_alone_is_enough_for_jwks_projects(
    minimal: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SUPABASE_JWT_SECRET")
    monkeypatch.setenv("SUPABASE_URL", "https://proj.supabase.co")
    assert load_settings().supabase_jwt_secret is None


@pytest.mark.parametrize("secret", ["changeme", "secret", "short-secret"])
def test_placeholder_or_short_secrets_are_refused(
    minimal: None, monkeypatch: pytest.MonkeyPatch, secret: str
) -> None:
    monkeypatch.setenv("SUPABASE_JWT_SECRET", secret)
    with pytest.raises(ConfigError, match="SUPABASE_JWT_SECRET must be the project's JWT secret"):
        load_settings()


def test_blank_optional_values_mean_unset(minimal: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deployment templates pass "" for parameters left blank."""
    monkeypatch.setenv("SUPABASE_JWT_SECRET", "")
    monkeypatch.setenv("SUPABASE_URL", "https://proj.supabase.co")
    monkeypatch.setenv("OPENAI_BASE_URL", " ")
    settings = load_settings()
    assert settings.supabase_jwt_secret is None and settings.openai_base_url is None
    monkeypatch.setenv("SUPABASE_URL", "")
    with pytest.raises(ConfigError, match="SUPABASE_JWT_SECRET"):
        load_settings()


def test_offline_model_needs_no_key(minimal: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    assert load_settings(offline_model=True).openai_api_key is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MEMORY_MAX_HISTORY_MESSAGES", "0"),
        ("MEMORY_MAX_HISTORY_MESSAGES", "51"),
        ("LTM_MAX_CHARS", "10"),
        ("MAX_MESSAGE_CHARS", "0"),
        ("SESSION_TTL_HOURS", "-1"),
        ("LOG_LEVEL", "LOUD"),
        ("MEMORY_ENABLED", "perhaps"),
    ],
)
def test_out_of_range_values_name_the_variable(
    minimal: None, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=f"invalid configuration: .*{name}"):
        load_settings()


def test_every_problem_is_reported_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAX_MESSAGE_CHARS", "0")
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert "DATABASE_URL" in str(error.value) and "MAX_MESSAGE_CHARS" in str(error.value)
