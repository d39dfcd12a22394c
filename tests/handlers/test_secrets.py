"""Secrets read at run time (memchat.secrets): where from, what shape, what errors."""

from __future__ import annotations

import json

import pytest

from memchat import secrets
from memchat.config import ConfigError
from tests.conftest import JWT_SECRET

ARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:memchat/openai-key-Ab12Cd"
PARAMETER = "/memchat/database-url"
DB = (
    "postgresql://postgres.abc:pw@aws-0-eu-west-1.pooler.supabase.com:6543/postgres?sslmode=require"
)


def store(values: dict[str, object]):
    calls: list[str] = []

    def fetch(name: str) -> object:
        calls.append(name)
        value = values[name]
        if isinstance(value, Exception):
            raise value
        return value

    return fetch, calls


def test_plain_environment_needs_no_fetch() -> None:
    fetch, calls = store({})
    env = {"DATABASE_URL": DB, "OPENAI_API_KEY": "sk-test"}
    assert secrets.resolve(environ=env, fetch_secret=fetch, fetch_parameter=fetch) == {}
    assert calls == []


def test_secret_arn_and_parameter_name() -> None:
    fetch_secret, secret_calls = store({ARN: "sk-live-123\n"})
    fetch_parameter, parameter_calls = store({PARAMETER: DB})
    env = {"OPENAI_API_KEY_SECRET_ARN": ARN, "DATABASE_URL_PARAMETER": PARAMETER}

    values = secrets.resolve(
        environ=env, fetch_secret=fetch_secret, fetch_parameter=fetch_parameter
    )

    assert values == {"openai_api_key": "sk-live-123", "database_url": DB}
    assert secret_calls == [ARN] and parameter_calls == [PARAMETER]


@pytest.mark.parametrize(
    "stored",
    [
        json.dumps({"OPENAI_API_KEY": "sk-json"}),
        json.dumps({"openai_api_key": "sk-json", "other": "x"}),
        b"sk-json",
    ],
)
def test_json_key_value_and_binary_secrets(stored: object) -> None:
    fetch, _ = store({ARN: stored})
    values = secrets.resolve(environ={"OPENAI_API_KEY_SECRET_ARN": ARN}, fetch_secret=fetch)
    assert values == {"openai_api_key": "sk-json"}


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        (json.dumps({"api_key": "sk"}), "has no key 'OPENAI_API_KEY'"),
        ("   ", "is empty"),
        (PermissionError("AccessDeniedException"), "could not read OPENAI_API_KEY_SECRET_ARN"),
    ],
)
def test_errors_name_the_variable_not_the_value(stored: object, message: str) -> None:
    fetch, _ = store({ARN: stored})
    with pytest.raises(ConfigError, match=message) as error:
        secrets.resolve(environ={"OPENAI_API_KEY_SECRET_ARN": ARN}, fetch_secret=fetch)
    assert "sk" not in str(error.value).replace("secretsmanager", "").replace(ARN, "")


def test_both_places_set_is_an_error() -> None:
    env = {"DATABASE_URL_SECRET_ARN": ARN, "DATABASE_URL_PARAMETER": PARAMETER}
    with pytest.raises(ConfigError, match="not both"):
        secrets.resolve(environ=env)


def test_load_settings_prefers_the_secret_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://ignored")
    monkeypatch.setenv("DATABASE_URL_PARAMETER", PARAMETER)
    monkeypatch.setenv("SUPABASE_JWT_SECRET", JWT_SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    for name in ("OPENAI_API_KEY_SECRET_ARN", "SUPABASE_JWT_SECRET_SECRET_ARN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(secrets, "_fetch_parameter", lambda name: DB)

    settings = secrets.load_settings()

    assert settings.database_url == DB and settings.openai_api_key == "sk-env"


JWT_PARAMETER = "/memchat/supabase-jwt-secret"
KEY_PARAMETER = "/memchat/openai-api-key"


class ParameterStore:
    """SSM Parameter Store as a deployed function sees it: names in, values out."""

    def __init__(self) -> None:
        self.values = {PARAMETER: DB, JWT_PARAMETER: JWT_SECRET, KEY_PARAMETER: "sk-from-the-store"}
        self.fetched: list[str] = []

    def fetch(self, name: str) -> str:
        self.fetched.append(name)
        return self.values[name]


@pytest.fixture
def parameter_store(monkeypatch: pytest.MonkeyPatch) -> ParameterStore:
    """Every secret pointed at in the store (all three), none in plain variables."""
    for variable in ("DATABASE_URL", "SUPABASE_JWT_SECRET", "OPENAI_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
        monkeypatch.delenv(f"{variable}_SECRET_ARN", raising=False)
    for name in ("SUPABASE_URL", "ROUTE_GROUPS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATABASE_URL_PARAMETER", PARAMETER)
    monkeypatch.setenv("SUPABASE_JWT_SECRET_PARAMETER", JWT_PARAMETER)
    monkeypatch.setenv("OPENAI_API_KEY_PARAMETER", KEY_PARAMETER)
    store = ParameterStore()
    monkeypatch.setattr(secrets, "_fetch_parameter", store.fetch)
    return store


@pytest.mark.parametrize("groups", ["sessions", "export", "sessions,export"])
def test_without_chat_the_model_key_is_never_fetched(
    parameter_store: ParameterStore, monkeypatch: pytest.MonkeyPatch, groups: str
) -> None:
    """Even pointed at the model key, a function that does not serve chat leaves it alone."""
    monkeypatch.setenv("ROUTE_GROUPS", groups)

    settings = secrets.load_settings()

    assert parameter_store.fetched == [PARAMETER, JWT_PARAMETER]
    assert settings.openai_api_key is None
    assert settings.database_url == DB and settings.supabase_jwt_secret == JWT_SECRET


@pytest.mark.parametrize("groups", [None, "chat", "chat,sessions,export"])
def test_serving_chat_fetches_the_model_key(
    parameter_store: ParameterStore, monkeypatch: pytest.MonkeyPatch, groups: str | None
) -> None:
    if groups is not None:
        monkeypatch.setenv("ROUTE_GROUPS", groups)

    settings = secrets.load_settings()

    assert sorted(parameter_store.fetched) == sorted([PARAMETER, JWT_PARAMETER, KEY_PARAMETER])
    assert settings.openai_api_key == "sk-from-the-store"


def test_bad_route_groups_fail_before_anything_is_fetched(
    parameter_store: ParameterStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROUTE_GROUPS", "chat,everything")
    with pytest.raises(ConfigError, match="ROUTE_GROUPS: unknown route group 'everything'"):
        secrets.load_settings()
    assert parameter_store.fetched == []


def test_a_placeholder_in_the_store_fails_by_name(parameter_store: ParameterStore) -> None:
    parameter_store.values[KEY_PARAMETER] = "sk-..."
    with pytest.raises(ConfigError, match="OPENAI_API_KEY looks like a placeholder") as error:
        secrets.load_settings()
    assert "sk-" not in str(error.value)


def test_through_powertools_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real fetchers, with AWS replaced by botocore's Stubber."""
    import boto3
    from aws_lambda_powertools.utilities import parameters
    from aws_lambda_powertools.utilities.parameters import base
    from botocore.stub import Stubber

    credentials = {
        "region_name": "eu-west-1",
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
    }
    sm = boto3.client("secretsmanager", **credentials)
    ssm = boto3.client("ssm", **credentials)
    with Stubber(sm) as sm_stub, Stubber(ssm) as ssm_stub:
        sm_stub.add_response(
            "get_secret_value",
            {"ARN": ARN, "Name": "memchat/openai-key", "SecretString": "sk-stubbed"},
            {"SecretId": ARN},
        )
        ssm_stub.add_response(
            "get_parameter",
            {"Parameter": {"Name": PARAMETER, "Type": "SecureString", "Value": DB}},
            {"Name": PARAMETER, "WithDecryption": True},
        )
        monkeypatch.setitem(
            base.DEFAULT_PROVIDERS, "secrets", parameters.SecretsProvider(boto3_client=sm)
        )
        monkeypatch.setitem(base.DEFAULT_PROVIDERS, "ssm", parameters.SSMProvider(boto3_client=ssm))

        values = secrets.resolve(
            environ={"OPENAI_API_KEY_SECRET_ARN": ARN, "DATABASE_URL_PARAMETER": PARAMETER}
        )

        assert values == {"openai_api_key": "sk-stubbed", "database_url": DB}
        sm_stub.assert_no_pending_responses()
        ssm_stub.assert_no_pending_responses()
