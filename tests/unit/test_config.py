"""Settings (memchat.config): read from the environment, refused early and clearly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from memchat.config import (
    ROUTE_GROUPS,
    ConfigError,
    Settings,
    is_placeholder,
    load_settings,
    secret_settings,
)

SECRET = "q8Zt3vKx1mW0pR7yL4nB6cJ9dF2gH5sA0eU3iO"
# Shaped like OpenAI's project keys (sk-proj- and about 150 random characters).
REAL_LOOKING_KEY = "sk-proj-" + "abc123DEF456ghi789_JKL012-mno345PQR678stu901VWXyz" * 3
# What `supabase start` uses locally; docs/deploy.md points memchat at it.
SUPABASE_LOCAL_JWT_SECRET = "super-secret-jwt-token-with-at-least-32-characters-long"

KEY_PLACEHOLDERS = [
    "changeme",
    "CHANGE_ME",
    "<your-key>",
    "<OPENAI_API_KEY>",
    "your-api-key",
    "YOUR_OPENAI_API_KEY",
    "sk-your-key-here",
    "sk-...",
    "sk-proj-...",
    "sk-\u2026",
    "xxx",
    "sk-xxxxxxxxxxxxxxxx",
    "sk-proj-xxxx-xxxx-xxxx",
    "${OPENAI_API_KEY}",
    "$OPENAI_API_KEY",
    "{{ secrets.OPENAI_API_KEY }}",
    "%OPENAI_API_KEY%",
    "OPENAI_API_KEY",
    '""',
    "''",
    "-",
    "***",
    "none",
    "null",
    "EMPTY",
    "placeholder",
    "sk-",
]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Only what a test sets counts: no setting leaks in from the shell."""
    for name in Settings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)
    yield


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
    assert settings.chat_rate_per_minute == 20 and settings.chat_rate_burst == 10
    assert settings.allow_anonymous_users is False


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


def test_names_match_without_regard_to_case_and_overrides_win(
    minimal: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("Memory_Recall_K", "5")
    monkeypatch.setenv("openai_model", "gpt-from-env")
    monkeypatch.setenv("ROUTE_GROUPS", " Chat, export ")
    monkeypatch.setenv("MEMORY_SOMETHING_ELSE", "ignored")  # not a setting: no error
    settings = load_settings(openai_model="gpt-from-caller")
    assert settings.memory_recall_k == 5
    assert settings.openai_model == "gpt-from-caller"
    assert settings.route_groups == frozenset({"chat", "export"})
    assert load_settings().openai_model == "gpt-from-env"


def test_a_bad_value_names_its_variable(minimal: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("memory_recall_k", "lots")
    monkeypatch.setenv("CHAT_RATE_BURST", "0")
    with pytest.raises(ConfigError) as refused:
        load_settings()
    assert "MEMORY_RECALL_K" in str(refused.value)
    assert "CHAT_RATE_BURST" in str(refused.value)


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


@pytest.mark.parametrize(
    "secret",
    [
        "changeme",
        "secret",
        "short-secret",
        # The same placeholder rule as for the API key, however long the value.
        "s" * 40,
        "<your-supabase-jwt-secret-from-the-dashboard>",
        "${SUPABASE_JWT_SECRET_FROM_THE_DASHBOARD_SETTINGS}",
        "your-jwt-secret-with-at-least-32-characters",
        "...a-secret-with-at-least-32-characters-in-it...",
    ],
)
def test_placeholder_or_short_secrets_are_refused(
    minimal: None, monkeypatch: pytest.MonkeyPatch, secret: str
) -> None:
    monkeypatch.setenv("SUPABASE_JWT_SECRET", secret)
    with pytest.raises(ConfigError, match="SUPABASE_JWT_SECRET must be the project's JWT secret"):
        load_settings()


@pytest.mark.parametrize("secret", [SECRET, SUPABASE_LOCAL_JWT_SECRET, "a" * 20 + "b" * 20])
def test_real_looking_jwt_secrets_pass(
    minimal: None, monkeypatch: pytest.MonkeyPatch, secret: str
) -> None:
    monkeypatch.setenv("SUPABASE_JWT_SECRET", secret)
    assert load_settings().supabase_jwt_secret == secret


@pytest.mark.parametrize("key", KEY_PLACEHOLDERS)
def test_a_placeholder_api_key_fails_at_start_by_name(
    minimal: None, monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", key)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY looks like a placeholder") as error:
        load_settings()
    # The message names the variable, never the value: it is the same for every value.
    monkeypatch.setenv("OPENAI_API_KEY", "changeme")
    with pytest.raises(ConfigError) as same:
        load_settings()
    assert str(error.value) == str(same.value)


@pytest.mark.parametrize("key", ["", "   "])
def test_an_empty_api_key_is_a_missing_one(
    minimal: None, monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", key)
    with pytest.raises(ConfigError, match="set OPENAI_API_KEY"):
        load_settings()


@pytest.mark.parametrize(
    "key", [REAL_LOOKING_KEY, "sk-abc123DEF456ghi789JKL012mno345", "test-key", "sk-test", "local"]
)
def test_real_looking_api_keys_pass(
    minimal: None, monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", key)
    assert load_settings().openai_api_key == key


def test_one_placeholder_rule_for_both_secrets() -> None:
    for value in KEY_PLACEHOLDERS:
        assert is_placeholder(value, "OPENAI_API_KEY"), value
    assert is_placeholder("SUPABASE_JWT_SECRET", "SUPABASE_JWT_SECRET")
    assert is_placeholder("<your-jwt-secret>", "SUPABASE_JWT_SECRET")
    for value in (REAL_LOOKING_KEY, "test-key", SECRET, SUPABASE_LOCAL_JWT_SECRET):
        assert not is_placeholder(value, "OPENAI_API_KEY"), value
        assert not is_placeholder(value, "SUPABASE_JWT_SECRET"), value


# ------------------------------------------------------------ route groups


def test_every_http_group_is_served_by_default(minimal: None) -> None:
    settings = load_settings()
    assert settings.route_groups == frozenset(ROUTE_GROUPS) == {"chat", "sessions", "export"}
    assert all(settings.serves(group) for group in ROUTE_GROUPS)
    assert settings.job is None  # the scheduled jobs are processes of their own


def test_the_summary_worker_needs_no_token_settings_but_the_model_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://localhost/memchat")
    monkeypatch.setenv("ROUTE_GROUPS", "chat")  # a job serves no routes, whatever it says
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        load_settings(job="summaries")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    settings = load_settings(job="summaries")  # no SUPABASE_JWT_SECRET / SUPABASE_URL needed
    assert settings.route_groups == frozenset() and settings.calls_model
    assert settings.openai_api_key == "sk-test"
    assert secret_settings({"chat"}, "summaries") == (
        "database_url",
        "openai_api_key",
        "embedding_api_key",
    )
    assert secret_settings(set(), "cleanup") == ("database_url",)


def test_route_groups_from_the_environment(minimal: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROUTE_GROUPS", " Sessions, export ,")
    settings = load_settings()
    assert settings.route_groups == {"sessions", "export"}
    assert not settings.serves("chat")


@pytest.mark.parametrize("value", ["chats", "chat,admin", "", " , "])
def test_bad_route_groups_are_named(
    minimal: None, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("ROUTE_GROUPS", value)
    with pytest.raises(ConfigError, match=r"ROUTE_GROUPS: .*chat, sessions, export"):
        load_settings()


@pytest.mark.parametrize("groups", ["sessions", "export", "sessions,export"])
def test_without_chat_no_model_key_is_needed_or_kept(
    minimal: None, monkeypatch: pytest.MonkeyPatch, groups: str
) -> None:
    monkeypatch.setenv("ROUTE_GROUPS", groups)
    monkeypatch.delenv("OPENAI_API_KEY")
    assert load_settings().openai_api_key is None
    # Given one anyway (or a placeholder), the settings do not hold it.
    for key in (REAL_LOOKING_KEY, "changeme"):
        monkeypatch.setenv("OPENAI_API_KEY", key)
        assert load_settings().openai_api_key is None


def test_serving_chat_needs_the_model_key(minimal: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROUTE_GROUPS", "chat")
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ConfigError, match="set OPENAI_API_KEY"):
        load_settings()
    monkeypatch.setenv("OPENAI_API_KEY", "<your-key>")
    with pytest.raises(ConfigError, match="OPENAI_API_KEY looks like a placeholder"):
        load_settings()


def test_the_secrets_each_route_group_reads() -> None:
    assert set(secret_settings(["chat"])) == {
        "database_url",
        "supabase_jwt_secret",
        "openai_api_key",
        "embedding_api_key",
    }
    assert set(secret_settings(ROUTE_GROUPS)) == set(secret_settings(["chat"]))
    for groups in (["sessions"], ["export"], ["sessions", "export"]):
        assert set(secret_settings(groups)) == {"database_url", "supabase_jwt_secret"}


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


# ------------------------------------------------------------ embeddings


def test_embeddings_default_to_the_chat_models_provider(minimal: None) -> None:
    """Unset, the embedding settings keep what they always were: the chat
    model's URL and key, text-embedding-3-small at 512, no prefixes."""
    settings = load_settings()
    assert settings.embedding_base_url is None and settings.embedding_api_key is None
    assert settings.embeddings_shared
    assert settings.openai_embedding_model == "text-embedding-3-small"
    assert settings.embedding_dimensions == 512
    assert settings.embedding_query_prefix == settings.embedding_document_prefix == ""
    assert settings.embedding_batch_size == 64


def test_embeddings_from_another_provider(minimal: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBEDDING_BASE_URL", "http://127.0.0.1:8001/v1")
    monkeypatch.setenv("EMBEDDING_API_KEY", "local")
    monkeypatch.setenv("EMBEDDING_QUERY_PREFIX", "query: ")
    monkeypatch.setenv("EMBEDDING_DOCUMENT_PREFIX", "passage: ")
    monkeypatch.setenv("EMBEDDING_BATCH_SIZE", "16")
    settings = load_settings()
    assert (settings.embedding_base_url, settings.embedding_api_key) == (
        "http://127.0.0.1:8001/v1",
        "local",
    )
    assert not settings.embeddings_shared
    # The prefixes are kept as written: e5's end in a space.
    assert (settings.embedding_query_prefix, settings.embedding_document_prefix) == (
        "query: ",
        "passage: ",
    )
    assert settings.embedding_batch_size == 16
    # The same URL and key as the chat model's are the chat model's provider.
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8001/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "local")
    assert load_settings().embeddings_shared


@pytest.mark.parametrize("key", ["changeme", "<your-key>", "sk-..."])
def test_a_placeholder_embedding_key_fails_at_start_by_name(
    minimal: None, monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    monkeypatch.setenv("EMBEDDING_API_KEY", key)
    with pytest.raises(ConfigError, match="EMBEDDING_API_KEY looks like a placeholder"):
        load_settings()


def test_blank_embedding_url_and_key_mean_the_chat_models(
    minimal: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMBEDDING_BASE_URL", " ")
    monkeypatch.setenv("EMBEDDING_API_KEY", "")
    settings = load_settings()
    assert settings.embedding_base_url is None and settings.embedding_api_key is None
    assert settings.embeddings_shared


@pytest.mark.parametrize("groups", ["sessions", "export"])
def test_without_chat_no_embedding_key_is_kept(
    minimal: None, monkeypatch: pytest.MonkeyPatch, groups: str
) -> None:
    monkeypatch.setenv("ROUTE_GROUPS", groups)
    monkeypatch.setenv("EMBEDDING_API_KEY", REAL_LOOKING_KEY)
    assert load_settings().embedding_api_key is None
    assert load_settings(job="summaries").embedding_api_key == REAL_LOOKING_KEY
    assert load_settings(job="cleanup").embedding_api_key is None


@pytest.mark.parametrize(
    ("name", "value"), [("EMBEDDING_BATCH_SIZE", "0"), ("EMBEDDING_BATCH_SIZE", "2049")]
)
def test_out_of_range_embedding_values_name_the_variable(
    minimal: None, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=f"invalid configuration: .*{name}"):
        load_settings()


@pytest.mark.parametrize(
    ("value", "mode"),
    [
        ("1", "rule"),
        ("true", "rule"),
        ("rule", "rule"),
        (" Model ", "model"),
        ("0", "off"),
        ("no", "off"),
        ("off", "off"),
    ],
)
def test_fact_keys_take_a_mode_or_the_old_yes_and_no(
    minimal: None, monkeypatch: pytest.MonkeyPatch, value: str, mode: str
) -> None:
    assert load_settings().memory_recall_facts == "rule"
    monkeypatch.setenv("MEMORY_RECALL_FACTS", value)
    assert load_settings().memory_recall_facts == mode


def test_an_unknown_fact_keys_mode_is_named(minimal: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORY_RECALL_FACTS", "llm")
    with pytest.raises(ConfigError) as refused:
        load_settings()
    assert "MEMORY_RECALL_FACTS" in str(refused.value)
    assert "'rule', 'model' or 'off'" in str(refused.value)
