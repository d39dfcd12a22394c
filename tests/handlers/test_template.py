"""template.yaml: lint-clean, and every function, route and secret in it is real.

Each handler the template names is imported and invoked here, with the
function's own ROUTE_GROUPS and without the model key where the function is
not meant to have it: the API Gateway ones once per route the template gives
them (unauthenticated, so 401 proves the app serves that route behind auth),
the streaming functions' server (export, chat stream) once per route its
function URL serves, the cleanup one with the schedule's own input. Every
route of the app is reachable through the HTTP API or a function URL, and
only the chat turns (POST /chat, POST /v1/chat/completions) through both
(JSON through the API, streamed through the chat stream URL).

Which secrets each function can read is worked out from the template itself
(the SAM transform's roles and the managed policies they attach, for each
SecretStore and with and without a JWT secret), and must be exactly the
secrets its environment points at, which must be exactly what its settings
need (`config.secret_settings` for its ROUTE_GROUPS).

The release path: the user-facing functions run from SnapStart snapshots
behind their `live` alias (which the API's routes and the function URLs
invoke); the scheduled functions' failures are kept (a queue) and alarmed;
two stacks can share an account (no fixed names); X-Ray is granted only
with tracing on; parameters that cannot work are refused (a secret of the
wrong kind for SecretStore, a CORS origin with a path).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, get_args

import httpx
import pytest
from cfnlint.decode import decode  # type: ignore[import-untyped]
from fastapi.routing import APIRoute
from pydantic import TypeAdapter

from memchat import bootstrap, secrets
from memchat.api import streamed as stream
from memchat.api.middleware import flat_routes
from memchat.config import (
    ROUTE_GROUPS,
    FactsMode,
    Settings,
    parse_route_groups,
    secret_settings,
)
from memchat.handlers import stream as server
from tests.cleanup.test_cleanup import CONTRACT as CLEANUP_RESULT
from tests.handlers.conftest import FakeContext, LambdaRuntime, body_of, route_event, token_for
from tests.utils.users import UserFactory

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
BUILD_SCRIPT = ROOT / "infra" / "build_lambda.sh"
HANDLER_PREFIX = "memchat.handlers."


def load_template() -> dict[str, Any]:
    template, errors = decode(str(TEMPLATE))
    assert not errors and template is not None, errors
    return dict(template)


def error_code(path: str, body: dict[str, Any]) -> Any:
    """An error body's code: the contract's, or OpenAI's shape under /v1/."""
    error = body["error"]
    return error["code"] if path.startswith("/v1/") else error


TEMPLATE_DATA = load_template()
RESOURCES = TEMPLATE_DATA["Resources"]
GLOBALS = TEMPLATE_DATA["Globals"]["Function"]
FUNCTIONS = {
    name: resource["Properties"]
    for name, resource in RESOURCES.items()
    if resource["Type"] == "AWS::Serverless::Function"
}


def run_sh() -> str:
    """The run.sh that infra/build_lambda.sh writes into the package."""
    found = re.search(r"<<'RUN_SH'\n(.*?)\nRUN_SH\n", BUILD_SCRIPT.read_text(), re.S)
    assert found, "infra/build_lambda.sh does not write run.sh"
    return found.group(1)


def handler_module(properties: dict[str, Any]) -> str:
    handler = properties.get("Handler", GLOBALS.get("Handler"))
    if handler == "run.sh":  # the Lambda Web Adapter runs it: it execs the module
        found = re.search(r"^exec python -m (\S+)$", run_sh(), re.M)
        assert found, run_sh()
        module = found.group(1)
    else:
        module, _, attribute = handler.rpartition(".")
        assert attribute == "handler", handler
    assert module.startswith(HANDLER_PREFIX), handler
    return module.removeprefix(HANDLER_PREFIX)


def events_of(kind: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (function, event["Properties"])
        for function, properties in FUNCTIONS.items()
        for event in properties.get("Events", {}).values()
        if event["Type"] == kind
    ]


HTTP_ROUTES = [
    (function, props["Method"], props["Path"]) for function, props in events_of("HttpApi")
]
URL_FUNCTIONS = [name for name, props in FUNCTIONS.items() if "FunctionUrlConfig" in props]
# The streaming functions: the Lambda Web Adapter runs memchat.handlers.stream.
STREAM_FUNCTIONS = ["ExportFunction", "ChatStreamFunction"]
# Served through both the HTTP API (JSON) and the chat stream URL (SSE, or JSON).
SERVED_TWICE = {("POST", "/chat"), ("POST", "/v1/chat/completions")}


def url_routes() -> list[tuple[str, str, str]]:
    """What each function URL serves: what its server lets through for its ROUTE_GROUPS."""
    routes = []
    for function in URL_FUNCTIONS:
        groups = FUNCTIONS[function]["Environment"]["Variables"]["ROUTE_GROUPS"]
        routes += [(function, m, p) for m, p in sorted(stream.routes_for(groups.split(",")))]
    return routes


URL_ROUTES = url_routes()


# ------------------------------------------------------------ evaluation
# Each deployment the parameters allow, as the conditions it sets (the
# others, which no test here varies, as the parameters' defaults set them).
DEFAULT_CONDITIONS = {
    "HasEmbeddingKey": False,
    "HasAlarmTopic": False,
    "ReserveChat": False,
    "ReserveChatStream": False,
    "ReserveExport": False,
}
SCENARIOS = [
    {"UseSsm": ssm, "HasJwtSecret": jwt, "HasEmbeddingKey": embedding_key, "TracingOn": tracing}
    for ssm, jwt, embedding_key, tracing in itertools.product([False, True], repeat=4)
]
SCENARIO_IDS = [
    f"{'ssm' if c['UseSsm'] else 'secretsmanager'}-{'jwt' if c['HasJwtSecret'] else 'jwks'}"
    f"{'-embedding-key' if c['HasEmbeddingKey'] else ''}"
    f"{'-tracing' if c['TracingOn'] else ''}"
    for c in SCENARIOS
]
NO_VALUE = object()
SECRET_ACTIONS = {"secretsmanager:GetSecretValue", "ssm:GetParameter"}
SECRET_REFERENCE = re.compile(r"^(?P<setting>[A-Z_]+?)_(?:SECRET_ARN|PARAMETER)$")
# Variables the Lambda runtime, Powertools and the Web Adapter read, not memchat's settings.
RUNTIME_VARIABLES = re.compile(r"^(POWERTOOLS_\w+|AWS_LWA_\w+|AWS_LAMBDA_EXEC_WRAPPER)$")
# Settings only the chat routes read: no other function is given them.
CHAT_ONLY = {
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_MODEL",
    "OPENAI_TIMEOUT_SECONDS",
    "OPENAI_MAX_RETRIES",
    "TURN_TIMEOUT_SECONDS",
    "MEMORY_ENABLED",
    "MEMORY_MAX_HISTORY_MESSAGES",
    "MEMORY_MAX_CONTEXT_CHARS",
    "MAX_MESSAGE_CHARS",
    "MAX_TOOL_ROUNDS",
    "CHAT_RATE_PER_MINUTE",
    "CHAT_RATE_BURST",
}
# How every HTTP function checks tokens: the same everywhere.
AUTH_SETTINGS = {"SUPABASE_URL", "ALLOW_ANONYMOUS_USERS"}
HTTP_FUNCTIONS = ["ChatFunction", "ChatStreamFunction", "SessionsFunction", "ExportFunction"]
# Variables the Lambda Web Adapter reads (template.yaml, the streaming functions).
ADAPTER_VARIABLES = {
    "AWS_LAMBDA_EXEC_WRAPPER",
    "AWS_LWA_INVOKE_MODE",
    "AWS_LWA_PORT",
    "AWS_LWA_READINESS_CHECK_PATH",
    "AWS_LWA_READINESS_CHECK_HEALTHY_STATUS",
    "AWS_LWA_SNAPSTART_BEFORE_CHECKPOINT_PATH",
    "AWS_LWA_SNAPSTART_AFTER_RESTORE_PATH",
}
# Served to users: SnapStart, through the `live` alias.
SNAPSTART_FUNCTIONS = ["ChatFunction", "SessionsFunction", "ChatStreamFunction", "ExportFunction"]
# Invoked asynchronously by EventBridge Scheduler.
SCHEDULED_FUNCTIONS = ["CleanupFunction", "SummaryFunction"]
ALIAS = "live"


def evaluate(node: Any, conditions: dict[str, bool]) -> Any:
    """The node with Fn::If resolved and AWS::NoValue dropped, as CloudFormation does."""
    if isinstance(node, dict):
        if set(node) == {"Fn::If"}:
            name, then, otherwise = node["Fn::If"]
            chosen = {**DEFAULT_CONDITIONS, **conditions}[name]
            return evaluate(then if chosen else otherwise, conditions)
        if node == {"Ref": "AWS::NoValue"}:
            return NO_VALUE
        items = {key: evaluate(value, conditions) for key, value in node.items()}
        return {key: value for key, value in items.items() if value is not NO_VALUE}
    if isinstance(node, list):
        values = [evaluate(value, conditions) for value in node]
        return [value for value in values if value is not NO_VALUE]
    return node


def parameters_named(resource: Any) -> set[str]:
    """The template parameters a policy Resource entry is built from."""
    if isinstance(resource, dict) and set(resource) == {"Ref"}:
        return {resource["Ref"]}
    if isinstance(resource, dict) and set(resource) == {"Fn::Sub"}:
        names = set(re.findall(r"\$\{([^}]+)\}", resource["Fn::Sub"]))
        return {name for name in names if not name.startswith("AWS::")}
    raise AssertionError(f"a secret policy resource that is not a parameter: {resource!r}")


def translate(parameters: dict[str, str]) -> dict[str, Any]:
    """The template after the SAM transform, as CloudFormation runs it with these parameters."""
    from samtranslator.translator.transform import transform  # type: ignore[import-untyped]

    class Policies:
        def load(self) -> dict[str, str]:
            return {
                "AWSLambdaBasicExecutionRole": "arn:aws:iam::aws:policy/service-role/"
                "AWSLambdaBasicExecutionRole",
                "AWSXrayWriteOnlyAccess": "arn:aws:iam::aws:policy/AWSXrayWriteOnlyAccess",
            }

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
        template = json.loads(json.dumps(TEMPLATE_DATA))
        # As `sam package` does.
        template["Globals"]["Function"]["CodeUri"] = "s3://bucket/memchat.zip"
        output: dict[str, Any] = transform(template, parameters, Policies())
    return output


@pytest.fixture(scope="module")
def translated() -> Iterator[dict[str, Any]]:
    """What `sam deploy` sends: the template after the SAM transform (default parameters)."""
    yield translate({})


def readable_secrets(
    translated: dict[str, Any], function: str, conditions: dict[str, bool]
) -> set[str]:
    """The secret parameters the deployed function's role may read."""
    resources = evaluate(translated["Resources"], conditions)
    role_ref = resources[function]["Properties"]["Role"]
    role = resources[role_ref["Fn::GetAtt"][0]]["Properties"]
    statements: list[dict[str, Any]] = []
    for policy in role.get("Policies", []):  # inline: SAM's own (none read secrets)
        statements.extend(policy["PolicyDocument"]["Statement"])
    for arn in role.get("ManagedPolicyArns", []):
        if isinstance(arn, dict):
            (name,) = parameters_named(arn)
            managed = resources[name]
            assert managed["Type"] == "AWS::IAM::ManagedPolicy", name
            statements.extend(managed["Properties"]["PolicyDocument"]["Statement"])
        else:
            assert arn.startswith("arn:aws:iam::aws:policy/"), arn  # AWS's own, no secrets
    readable: set[str] = set()
    for statement in statements:
        actions = statement["Action"]
        actions = {actions} if isinstance(actions, str) else set(actions)
        if not actions & SECRET_ACTIONS:
            continue
        assert statement["Effect"] == "Allow" and actions <= SECRET_ACTIONS, statement
        targets = statement["Resource"]
        for target in targets if isinstance(targets, list) else [targets]:
            readable |= parameters_named(target)
    return readable


def environment(function: str, conditions: dict[str, bool]) -> dict[str, Any]:
    variables: dict[str, Any] = evaluate(
        {
            **GLOBALS["Environment"]["Variables"],
            **FUNCTIONS[function].get("Environment", {}).get("Variables", {}),
        },
        conditions,
    )
    return variables


def pointed_at(variables: dict[str, Any]) -> dict[str, str]:
    """Secret setting -> the template parameter its *_SECRET_ARN/*_PARAMETER names."""
    found: dict[str, str] = {}
    for name, value in variables.items():
        match = SECRET_REFERENCE.match(name)
        if match:
            setting = match.group("setting").lower()
            assert setting not in found, f"{setting} is pointed at twice"
            (found[setting],) = parameters_named(value)
    return found


def route_groups_of(function: str) -> frozenset[str]:
    variables = FUNCTIONS[function]["Environment"]["Variables"]
    assert "ROUTE_GROUPS" in variables, f"{function} does not say which routes it serves"
    return frozenset(parse_route_groups(variables["ROUTE_GROUPS"]))


def test_cfn_lint_is_clean() -> None:
    cfn_lint = Path(sys.executable).with_name("cfn-lint")
    command = str(cfn_lint) if cfn_lint.exists() else shutil.which("cfn-lint")
    assert command, "cfn-lint is not installed (it is in the test extras)"
    result = subprocess.run(
        [command, str(TEMPLATE)], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_sam_translates_it(translated: dict[str, Any]) -> None:
    """What `sam deploy` sends: the SAM transform must accept the template."""
    resources = translated["Resources"]
    routes = resources["HttpApi"]["Properties"]["Body"]["paths"]
    assert {(m.upper(), p) for p, ms in routes.items() for m in ms} == {
        (m, p) for _, m, p in HTTP_ROUTES
    }
    assert "CleanupFunctionSchedule" in resources
    assert "SummaryFunctionSchedule" in resources
    for function in STREAM_FUNCTIONS:
        url = resources[f"{function}Url"]
        assert url["Type"] == "AWS::Lambda::Url"
        # The URL invokes the `live` alias (SnapStart runs published versions only).
        alias = f"{function}Alias{ALIAS}"
        assert url["Properties"]["TargetFunctionArn"] == {"Ref": alias}
        assert url["Properties"]["InvokeMode"] == "RESPONSE_STREAM"
        assert url["Properties"]["AuthType"] == "NONE"
        # Function URLs created since October 2025 need both permissions to be
        # public, on what the URL invokes (a 403 on every request means one is missing).
        permissions = {
            r["Properties"]["Action"]: r["Properties"]
            for r in resources.values()
            if r["Type"] == "AWS::Lambda::Permission"
            and r["Properties"]["FunctionName"] == {"Ref": alias}
        }
        assert permissions["lambda:InvokeFunctionUrl"]["FunctionUrlAuthType"] == "NONE", function
        assert permissions["lambda:InvokeFunction"]["InvokedViaFunctionUrl"] is True, function


def test_runtime_and_architecture_match_the_build_script() -> None:
    script = BUILD_SCRIPT.read_text()
    version = re.search(r'^PYTHON_VERSION="([\d.]+)"', script, re.M)
    arch = re.search(r'^ARCH="(\w+)"', script, re.M)
    assert version and arch
    assert GLOBALS["Runtime"] == f"python{version.group(1)}"
    assert GLOBALS["Architectures"] == [arch.group(1)]


def test_sam_build_has_a_make_target_per_function() -> None:
    """`BuildMethod: makefile` runs `make build-<LogicalId>` in CodeUri (the repo root)."""
    text = (ROOT / "Makefile").read_text()
    for name, resource in RESOURCES.items():
        if resource["Type"] == "AWS::Serverless::Function":
            assert resource["Metadata"] == {"BuildMethod": "makefile"}
            assert re.search(rf"^[^#\n]*\bbuild-{name}\b[^\n]*:", text, re.M), name
    assert "infra/build_lambda.sh" in text and "$(ARTIFACTS_DIR)" in text


def test_every_handler_module_is_deployed() -> None:
    deployed = {handler_module(p) for p in FUNCTIONS.values()}
    on_disk = {
        path.stem
        for path in (ROOT / "functions" / "memchat" / "handlers").glob("*.py")
        if path.stem not in {"__init__", "http", "instance"}  # shared set-up, not entry points
    }
    assert deployed == on_disk == {"chat", "clear", "stream", "cleanup", "summarize"}


async def test_template_routes_are_the_apps_routes(settings: Settings) -> None:

    async def served(groups: frozenset[str]) -> set[tuple[str, str]]:
        app = bootstrap.app(settings.model_copy(update={"route_groups": groups}))
        paths = app.openapi()["paths"]
        state = app.state.memchat
        await state.close()
        # Only an app that serves chat builds a model client.
        assert (state.model is not None) == ("chat" in groups), groups
        documented = {(m.upper(), path) for path, methods in paths.items() for m in methods}
        # POST /mcp speaks MCP's JSON-RPC, outside the OpenAPI document.
        protocol = {
            (method, route.path)
            for route in flat_routes(app.routes)
            if isinstance(route, APIRoute) and route.tags == ["mcp"]
            for method in route.methods
        }
        return documented | protocol

    declared = [(method, path) for _, method, path in [*HTTP_ROUTES, *URL_ROUTES]]
    # Every route of the app is reachable, through the HTTP API or a function
    # URL; each through one door but the chat turns (POST /chat, POST
    # /v1/chat/completions), which have two: JSON through the API
    # (ChatFunction), streamed through the chat stream URL.
    assert set(declared) == await served(frozenset(ROUTE_GROUPS))
    twice = {route for route in declared if declared.count(route) > 1}
    assert twice == SERVED_TWICE, twice
    assert {f for f, m, p in HTTP_ROUTES if (m, p) in SERVED_TWICE} == {"ChatFunction"}
    assert {f for f, m, p in URL_ROUTES if (m, p) in SERVED_TWICE} == {"ChatStreamFunction"}

    # Each function's app (its ROUTE_GROUPS) has its routes and no other but
    # /health; behind a function URL, what its stream server lets through (the
    # chat stream function's app also has GET /memory/search, which the
    # server answers 404: the HTTP API's ChatFunction serves it).
    health = {("GET", stream.READINESS_PATH)}
    for function in HTTP_FUNCTIONS:
        own = {(m, p) for f, m, p in [*HTTP_ROUTES, *URL_ROUTES] if f == function}
        assert own, function
        groups = route_groups_of(function)
        app_routes = await served(groups)
        if function in URL_FUNCTIONS:
            app_routes &= stream.routes_for(groups) | health
        assert own <= app_routes and app_routes - own <= health, function


@pytest.mark.parametrize("function", STREAM_FUNCTIONS)
def test_the_streaming_functions_run_the_stream_server_behind_the_web_adapter(
    function: str,
) -> None:
    """A function URL in RESPONSE_STREAM mode, the Web Adapter and run.sh; no API Gateway."""
    assert URL_FUNCTIONS == STREAM_FUNCTIONS
    properties = FUNCTIONS[function]
    assert "Events" not in properties  # not on the HTTP API
    assert properties["FunctionUrlConfig"]["AuthType"] == "NONE"  # the app checks the token
    assert properties["FunctionUrlConfig"]["InvokeMode"] == "RESPONSE_STREAM"
    assert properties["Timeout"] > 29  # no API Gateway 30 s limit in front of it

    # The AWS Lambda Web Adapter layer, for the template's architecture, runs run.sh.
    assert properties["Handler"] == "run.sh"
    assert handler_module(properties) == "stream"
    (layer,) = properties["Layers"]
    arch = {"arm64": "Arm64", "x86_64": "X86"}[GLOBALS["Architectures"][0]]
    assert re.fullmatch(
        rf"arn:aws:lambda:\$\{{AWS::Region\}}:753240598075:layer:LambdaAdapterLayer{arch}:\d+",
        layer["Fn::Sub"],
    ), layer
    assert properties["Layers"] == FUNCTIONS["ExportFunction"]["Layers"]  # one adapter version
    variables = properties["Environment"]["Variables"]
    assert set(variables) >= ADAPTER_VARIABLES, function
    assert variables["AWS_LAMBDA_EXEC_WRAPPER"] == "/opt/bootstrap"
    assert variables["AWS_LWA_INVOKE_MODE"] == "response_stream"
    assert variables["AWS_LWA_READINESS_CHECK_PATH"] == stream.READINESS_PATH
    assert int(variables.get("AWS_LWA_PORT", server.DEFAULT_PORT)) == server.DEFAULT_PORT
    assert stream.routes_for(route_groups_of(function)), f"{function} would serve nothing"

    # The browser calls it from the same origin as the API.
    cors = properties["FunctionUrlConfig"]["Cors"]
    api_cors = RESOURCES["HttpApi"]["Properties"]["CorsConfiguration"]
    assert cors["AllowOrigins"] == api_cors["AllowOrigins"] == [{"Ref": "CorsAllowOrigin"}]
    assert "authorization" in cors["AllowHeaders"]
    # Its base URL is a stack output.
    url = {"Fn::GetAtt": [f"{function}Url", "FunctionUrl"]}
    outputs = [n for n, o in TEMPLATE_DATA["Outputs"].items() if o["Value"] == url]
    assert len(outputs) == 1, outputs


def test_the_exports_are_streamed_from_a_function_url() -> None:
    """Through API Gateway a Lambda response is buffered and capped at 6 MB."""
    export = FUNCTIONS["ExportFunction"]
    assert export["Timeout"] == 180  # past the first 6 MB, 2 MB/s: 200 MB in ~100 s
    cors = export["FunctionUrlConfig"]["Cors"]
    assert cors["AllowMethods"] == ["GET"]
    assert cors["AllowHeaders"] == ["authorization", "x-request-id"]
    assert "content-disposition" in cors["ExposeHeaders"]
    assert TEMPLATE_DATA["Outputs"]["ExportUrl"]["Value"] == {
        "Fn::GetAtt": ["ExportFunctionUrl", "FunctionUrl"]
    }


def test_the_streamed_chat_is_the_chat_function_behind_a_function_url() -> None:
    """POST /chat's Server-Sent Events: an HTTP API buffers them and stops at 30 s."""
    chat, chat_stream = FUNCTIONS["ChatFunction"], FUNCTIONS["ChatStreamFunction"]
    assert stream.routes_for(route_groups_of("ChatStreamFunction")) == SERVED_TWICE

    # Exactly the chat function's settings, secrets and parameters, plus the adapter's.
    chat_variables = chat["Environment"]["Variables"]
    stream_variables = chat_stream["Environment"]["Variables"]
    assert set(stream_variables) - set(chat_variables) == ADAPTER_VARIABLES
    assert {k: v for k, v in stream_variables.items() if k not in ADAPTER_VARIABLES} == (
        chat_variables
    )
    export_variables = FUNCTIONS["ExportFunction"]["Environment"]["Variables"]
    assert {k: stream_variables[k] for k in ADAPTER_VARIABLES} == {
        k: export_variables[k] for k in ADAPTER_VARIABLES
    }
    assert chat_stream["Policies"] == chat["Policies"]
    assert chat_stream["MemorySize"] == chat["MemorySize"]

    # No API Gateway in front: the function's timeout bounds the request, and
    # must outlast a whole turn (TURN_TIMEOUT_SECONDS of model conversation,
    # the context load before it and the record after it).
    turn_timeout = Settings.model_fields["turn_timeout_seconds"].default
    assert "TURN_TIMEOUT_SECONDS" not in stream_variables  # the same turn as through the API
    assert 2 * turn_timeout <= chat_stream["Timeout"] <= 900
    assert chat["Timeout"] < 30  # the HTTP API's POST /chat is unchanged

    # The browser's fetch(): POST with the token, JSON and Accept; reads the session id.
    cors = chat_stream["FunctionUrlConfig"]["Cors"]
    assert cors["AllowMethods"] == ["POST"]
    assert cors["AllowHeaders"] == [
        "authorization",
        "content-type",
        "x-session-id",
        "x-request-id",
        "accept",
    ]
    assert cors["ExposeHeaders"] == ["x-session-id", "x-request-id"]
    outputs = TEMPLATE_DATA["Outputs"]
    assert outputs["ChatStreamUrl"]["Value"] == {
        "Fn::GetAtt": ["ChatStreamFunctionUrl", "FunctionUrl"]
    }
    assert outputs["ChatStreamFunctionName"]["Value"] == {"Ref": "ChatStreamFunction"}
    assert chat_stream["LoggingConfig"]["LogGroup"] == {"Ref": "ChatStreamLogs"}
    assert RESOURCES["ChatStreamLogs"]["Type"] == "AWS::Logs::LogGroup"


def test_run_sh_starts_the_stream_server() -> None:
    script = run_sh()
    assert script.startswith("#!/bin/bash\n")
    assert 'cd "$LAMBDA_TASK_ROOT"' in script
    assert script.rstrip().endswith("exec python -m memchat.handlers.stream")
    assert re.search(r'^chmod 0755 "\$OUT/run.sh"$', BUILD_SCRIPT.read_text(), re.M)


def test_each_function_says_which_routes_it_serves() -> None:
    groups = {function: route_groups_of(function) for function in HTTP_FUNCTIONS}
    assert groups == {
        "ChatFunction": {"chat"},
        "ChatStreamFunction": {"chat"},
        "SessionsFunction": {"sessions"},
        "ExportFunction": {"export"},
    }
    assert "ROUTE_GROUPS" not in GLOBALS["Environment"]["Variables"]
    assert "ROUTE_GROUPS" not in FUNCTIONS["CleanupFunction"]["Environment"]["Variables"]


@pytest.mark.parametrize("conditions", SCENARIOS, ids=SCENARIO_IDS)
def test_each_function_can_read_exactly_the_secrets_it_uses(
    translated: dict[str, Any], conditions: dict[str, bool]
) -> None:
    """From the deployed roles' policies: no function can read a secret it does not use."""
    jwt = {"SupabaseJwtSecretSecret"} if conditions["HasJwtSecret"] else set()
    # The embeddings' own key, when given, goes where the model's key goes.
    keys = {"OpenAiApiKeySecret"} | (
        {"EmbeddingApiKeySecret"} if conditions["HasEmbeddingKey"] else set()
    )
    expected = {
        "ChatFunction": {"DatabaseUrlSecret", *keys, *jwt},
        "ChatStreamFunction": {"DatabaseUrlSecret", *keys, *jwt},
        "SessionsFunction": {"DatabaseUrlSecret", *jwt},
        "ExportFunction": {"DatabaseUrlSecret", *jwt},
        "CleanupFunction": {"CleanupDatabaseUrlSecret"},
        "SummaryFunction": {"SummaryDatabaseUrlSecret", *keys},
    }
    assert set(FUNCTIONS) == set(expected)
    for function, secrets_used in expected.items():
        readable = readable_secrets(translated, function, conditions)
        assert readable == secrets_used, function
        # ...and exactly the secrets its environment points at.
        assert set(pointed_at(environment(function, conditions)).values()) == readable, function
    # The model keys in particular: the chat functions' and the summary worker's alone.
    for function in ("SessionsFunction", "ExportFunction", "CleanupFunction"):
        readable = readable_secrets(translated, function, conditions)
        assert not {"OpenAiApiKeySecret", "EmbeddingApiKeySecret"} & readable, function


@pytest.mark.parametrize("conditions", SCENARIOS, ids=SCENARIO_IDS)
@pytest.mark.parametrize("function", HTTP_FUNCTIONS)
def test_http_functions_get_what_their_settings_need(
    function: str, conditions: dict[str, bool]
) -> None:
    variables = environment(function, conditions)
    groups = route_groups_of(function)
    settings_fields = {name.upper() for name in Settings.model_fields}

    # Secrets: exactly those config.secret_settings names for its route groups,
    # each from the right parameter and the right store.
    needed = set(secret_settings(groups))
    if not conditions["HasJwtSecret"]:
        needed.discard("supabase_jwt_secret")  # tokens are checked through SUPABASE_URL's JWKS
    if not conditions["HasEmbeddingKey"]:
        needed.discard("embedding_api_key")  # optional: the embeddings use the model's key
    references = pointed_at(variables)
    assert set(references) == needed, function
    assert references["database_url"] == "DatabaseUrlSecret"
    if "openai_api_key" in references:
        assert references["openai_api_key"] == "OpenAiApiKeySecret"
    if "embedding_api_key" in references:
        assert references["embedding_api_key"] == "EmbeddingApiKeySecret"
    suffix = "_PARAMETER" if conditions["UseSsm"] else "_SECRET_ARN"
    assert all(n.endswith(suffix) for n in variables if SECRET_REFERENCE.match(n)), variables

    # Everything else it gets is one of its settings (or the runtime's own).
    for name in variables:
        assert (
            name in settings_fields or SECRET_REFERENCE.match(name) or RUNTIME_VARIABLES.match(name)
        ), f"{function}: {name} is not a setting"
    plain = {name for name in variables if name in settings_fields}
    if "chat" in groups:
        # The model and the per-user limit reach it.
        assert plain >= {"OPENAI_MODEL", "OPENAI_TIMEOUT_SECONDS", "CHAT_RATE_PER_MINUTE"}
    else:
        assert not CHAT_ONLY & plain, f"{function} gets chat-only settings"
    assert plain >= AUTH_SETTINGS, function  # tokens are checked the same everywhere


# What decides an embedding: the model, its size, the provider and its key.
# The summary function's backfill embeds imported messages, which turns then
# compare with their own: it must embed exactly as the chat functions do.
EMBEDDING_SETTINGS = (
    "OPENAI_EMBEDDING_MODEL",
    "EMBEDDING_DIMENSIONS",
    "EMBEDDING_BASE_URL",
    "EMBEDDING_DOCUMENT_PREFIX",
    "OPENAI_BASE_URL",
)


@pytest.mark.parametrize("conditions", SCENARIOS, ids=SCENARIO_IDS)
def test_the_backfill_embeds_as_the_chat_functions_do(conditions: dict[str, bool]) -> None:
    chat = environment("ChatFunction", conditions)
    parameters = TEMPLATE_DATA["Parameters"]
    fields = Settings.model_fields
    for function in ("ChatStreamFunction", "SummaryFunction"):
        variables = environment(function, conditions)
        for name in EMBEDDING_SETTINGS:
            assert variables.get(name) == chat.get(name), f"{function}: {name}"
        # ...and the same keys, from the same secrets.
        keys = {"openai_api_key", "embedding_api_key"}
        own = {k: v for k, v in pointed_at(variables).items() if k in keys}
        assert own == {k: v for k, v in pointed_at(chat).items() if k in keys}, function
    # Stack parameters, with the app's defaults (an empty base URL: the model's).
    assert chat["OPENAI_EMBEDDING_MODEL"] == {"Ref": "EmbeddingModel"}
    assert chat["EMBEDDING_DIMENSIONS"] == {"Ref": "EmbeddingDimensions"}
    assert chat["EMBEDDING_BASE_URL"] == {"Ref": "EmbeddingBaseUrl"}
    assert parameters["EmbeddingDimensions"]["Default"] == fields["embedding_dimensions"].default
    assert parameters["EmbeddingBaseUrl"]["Default"] == ""
    assert fields["embedding_base_url"].default is None


def import_function() -> str:
    (function,) = [f for f, m, p in HTTP_ROUTES if (m, p) == ("POST", "/sessions/import")]
    return function


# A Lambda function's synchronous request payload (the whole API Gateway event).
LAMBDA_PAYLOAD_BYTES = 6 * 1024 * 1024


def test_the_import_body_cap_fits_lambdas_payload_limit() -> None:
    """IMPORT_MAX_BYTES of the function serving POST /sessions/import: a body
    at the cap still fits the invocation event, even base64-encoded (API
    Gateway encodes bodies it deems binary), with room for the headers."""
    function = import_function()
    variables = FUNCTIONS[function]["Environment"]["Variables"]
    assert "IMPORT_MAX_BYTES" in variables, f"{function} takes the app's 30 MB default"
    cap = int(variables["IMPORT_MAX_BYTES"])
    field = Settings.model_fields["import_max_bytes"]
    assert TypeAdapter(Annotated[int, *field.metadata]).validate_python(cap) == cap
    assert cap < field.default
    encoded = 4 * -(-cap // 3)
    assert encoded + 256 * 1024 <= LAMBDA_PAYLOAD_BYTES, cap


def test_the_import_status_advertises_what_the_deployment_accepts(
    lambda_: LambdaRuntime, monkeypatch: pytest.MonkeyPatch, users: UserFactory
) -> None:
    """As deployed (the function's ROUTE_GROUPS and IMPORT_MAX_BYTES): the
    status says the template's cap, and a body over it is refused before it
    is read; `memchat import` splits a file by what the status says."""
    function = import_function()
    as_deployed(monkeypatch, function)
    cap = FUNCTIONS[function]["Environment"]["Variables"]["IMPORT_MAX_BYTES"]
    monkeypatch.setenv("IMPORT_MAX_BYTES", cap)
    token = token_for(users.create().user_id)
    module = handler_module(FUNCTIONS[function])
    context = FakeContext(function_name=function)

    status = lambda_.invoke(
        module,
        route_event("GET", "/sessions/import/status", "/sessions/import/status", token=token),
        context,
    )
    assert status["statusCode"] == 200, status
    assert body_of(status)["limits"]["max_request_bytes"] == int(cap)

    event = route_event("POST", "/sessions/import", "/sessions/import", token=token)
    event["headers"].update({"content-type": "application/json"})
    event["body"] = '{"sessions": [' + " " * int(cap) + "]}"
    event["headers"]["content-length"] = str(len(event["body"]))
    refused = lambda_.invoke(module, event, context)
    assert refused["statusCode"] == 413, refused
    assert body_of(refused)["detail"] == f"The request body is over {cap} bytes."


@pytest.mark.parametrize("function", ["ChatFunction", "ChatStreamFunction"])
def test_the_chat_settings_are_stack_parameters_with_the_apps_defaults(function: str) -> None:
    chat = FUNCTIONS[function]["Environment"]["Variables"]
    parameters = TEMPLATE_DATA["Parameters"]
    fields = Settings.model_fields
    for variable, parameter in [
        ("CHAT_RATE_PER_MINUTE", "ChatRatePerMinute"),
        ("CHAT_RATE_BURST", "ChatRateBurst"),
        ("ALLOW_ANONYMOUS_USERS", "AllowAnonymousUsers"),
        ("MEMORY_MAX_CONTEXT_TOKENS", "MemoryMaxContextTokens"),
        ("MEMORY_RECALL_K", "MemoryRecallK"),
        ("MEMORY_RECALL_MIN_SCORE", "MemoryRecallMinScore"),
        ("MEMORY_RECALL_DUPLICATE_SCORE", "MemoryRecallDuplicateScore"),
        ("MEMORY_RECALL_WORDS", "MemoryRecallWords"),
        ("MEMORY_RECALL_TIME", "MemoryRecallTime"),
        ("EMBEDDING_DIMENSIONS", "EmbeddingDimensions"),
        ("EMBEDDING_TIMEOUT_SECONDS", "EmbeddingTimeoutSeconds"),
    ]:
        assert chat[variable] == {"Ref": parameter}
        default = fields[variable.lower()].default
        assert float(parameters[parameter]["Default"]) == float(default), parameter
    assert chat["OPENAI_EMBEDDING_MODEL"] == {"Ref": "EmbeddingModel"}
    assert parameters["EmbeddingModel"]["Default"] == fields["openai_embedding_model"].default
    for function in HTTP_FUNCTIONS:
        variables = FUNCTIONS[function]["Environment"]["Variables"]
        assert variables["ALLOW_ANONYMOUS_USERS"] == {"Ref": "AllowAnonymousUsers"}, function


def test_the_fact_keys_mode_is_a_stack_parameter_for_the_backfill() -> None:
    """The summary function runs the embedding backfill, which makes the fact
    keys (MEMORY_RECALL_FACTS): every mode the app takes, its default."""
    variables = FUNCTIONS["SummaryFunction"]["Environment"]["Variables"]
    parameter = TEMPLATE_DATA["Parameters"]["MemoryRecallFacts"]
    assert variables["MEMORY_RECALL_FACTS"] == {"Ref": "MemoryRecallFacts"}
    assert parameter["Default"] == Settings.model_fields["memory_recall_facts"].default
    assert set(parameter["AllowedValues"]) == set(get_args(FactsMode))


@pytest.mark.parametrize("conditions", SCENARIOS, ids=SCENARIO_IDS)
def test_cleanup_gets_only_its_own_database_url(conditions: dict[str, bool]) -> None:
    variables = environment("CleanupFunction", conditions)
    assert pointed_at(variables) == {"database_url": "CleanupDatabaseUrlSecret"}
    own = {name for name in variables if not RUNTIME_VARIABLES.match(name)}
    reference = "DATABASE_URL_PARAMETER" if conditions["UseSsm"] else "DATABASE_URL_SECRET_ARN"
    assert own == {
        reference,
        "CLEANUP_BATCH_SIZE",
        "CLEANUP_PAUSE_FACTOR",
        "MEMORY_RETENTION_DAYS",
        "LOG_LEVEL",
    }


def test_secrets_are_passed_by_reference_only() -> None:
    secret_variables = {name.upper() for name in secrets.SECRET_SETTINGS}
    for function, properties in FUNCTIONS.items():
        variables = {
            **GLOBALS["Environment"]["Variables"],
            **properties.get("Environment", {}).get("Variables", {}),
        }
        assert not secret_variables & set(variables), f"{function} has a secret value in env"
        for name in variables:
            if name.endswith(("_SECRET_ARN", "_PARAMETER")):
                assert name.rsplit("_SECRET_ARN", 1)[0].rsplit("_PARAMETER", 1)[0] in (
                    secret_variables
                ), name


def test_secret_policies_allow_reading_only_the_named_secrets() -> None:
    text = json.dumps(
        {k: v for k, v in RESOURCES.items() if v["Type"] == "AWS::IAM::ManagedPolicy"}
    )
    actions = set(re.findall(r'"Action": "([^"]+)"', text))
    assert actions == {"ssm:GetParameter", "secretsmanager:GetSecretValue"}
    assert '"*"' not in text and '"Resource": "*"' not in text
    assert FUNCTIONS["CleanupFunction"]["Policies"] == [{"Ref": "ReadCleanupSecretsPolicy"}]
    assert FUNCTIONS["SummaryFunction"]["Policies"] == [
        {"Ref": "ReadSummarySecretsPolicy"},
        {"Ref": "ReadModelKeyPolicy"},
    ]
    for function in ("ChatFunction", "ChatStreamFunction"):
        assert FUNCTIONS[function]["Policies"] == [
            {"Ref": "ReadApiSecretsPolicy"},
            {"Ref": "ReadModelKeyPolicy"},
        ], function
    for function in ("SessionsFunction", "ExportFunction"):
        assert FUNCTIONS[function]["Policies"] == [{"Ref": "ReadApiSecretsPolicy"}], function


def as_deployed(monkeypatch: pytest.MonkeyPatch, function: str) -> None:
    """The function's ROUTE_GROUPS, and no model key unless it serves chat."""
    groups = route_groups_of(function)
    monkeypatch.setenv("ROUTE_GROUPS", ",".join(sorted(groups)))
    if "openai_api_key" not in secret_settings(groups):
        monkeypatch.delenv("OPENAI_API_KEY")


@pytest.mark.parametrize(
    ("function", "method", "path"), HTTP_ROUTES, ids=[f"{m} {p}" for _, m, p in HTTP_ROUTES]
)
def test_each_http_route_reaches_its_handler(
    lambda_: LambdaRuntime,
    monkeypatch: pytest.MonkeyPatch,
    function: str,
    method: str,
    path: str,
) -> None:
    as_deployed(monkeypatch, function)
    concrete = path.replace("{session_id}", "6f1c1d2e-4b7a-4c3e-9a51-2f0e8d9c7b10")
    event = route_event(method, path, concrete)
    if "{session_id}" in path:
        event["pathParameters"] = {"session_id": concrete.rsplit("/", 1)[1]}

    response = lambda_.invoke(
        handler_module(FUNCTIONS[function]), event, FakeContext(function_name=function)
    )

    if path == "/health":
        assert response["statusCode"] == 200, response
    else:
        assert response["statusCode"] == 401, response
        assert error_code(path, body_of(response)) == "unauthorized"


@pytest.mark.parametrize(
    ("function", "method", "path"), URL_ROUTES, ids=[f"{m} {p}" for _, m, p in URL_ROUTES]
)
def test_each_function_url_route_reaches_the_stream_server(
    lambda_: LambdaRuntime,
    monkeypatch: pytest.MonkeyPatch,
    function: str,
    method: str,
    path: str,
) -> None:
    as_deployed(monkeypatch, function)
    concrete = path.replace("{session_id}", "6f1c1d2e-4b7a-4c3e-9a51-2f0e8d9c7b10")
    lambda_.load(handler_module(FUNCTIONS[function]))  # the function's settings, as deployed

    async def call() -> list[httpx.Response]:
        app = bootstrap.stream_app()
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://lwa") as client:
                return [
                    await client.request(method, concrete),
                    await client.get(stream.READINESS_PATH),
                ]
        finally:
            await app.app.state.memchat.close()

    loop = asyncio.new_event_loop()
    try:
        response, readiness = loop.run_until_complete(call())
    finally:
        loop.close()

    assert response.status_code == 401, response.text
    assert error_code(path, response.json()) == "unauthorized"
    assert readiness.status_code == 200, readiness.text


def test_the_schedule_input_drives_the_cleanup_handler(
    lambda_: LambdaRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OPENAI_API_KEY", "SUPABASE_JWT_SECRET"):  # it has neither
        monkeypatch.delenv(name)
    ((function, schedule),) = [(f, e) for f, e in events_of("ScheduleV2") if f == "CleanupFunction"]
    event = json.loads(schedule["Input"])  # placeholders are filled in by the Scheduler
    assert event["dry_run"] is False
    result = lambda_.invoke(
        handler_module(FUNCTIONS[function]), event, FakeContext(function_name=function)
    )
    assert set(result) == CLEANUP_RESULT


# ------------------------------------------------------------ release path
def integration_targets(translated: dict[str, Any]) -> dict[tuple[str, str], str]:
    """(method, path) -> what the HTTP API's integration invokes (a resource's logical id)."""
    targets = {}
    for path, methods in translated["Resources"]["HttpApi"]["Properties"]["Body"]["paths"].items():
        for method, operation in methods.items():
            uri = operation["x-amazon-apigateway-integration"]["uri"]["Fn::Sub"]
            found = re.search(r"/functions/\$\{(\w+)\}/invocations$", uri)
            assert found, uri
            targets[(method.upper(), path)] = found.group(1)
    return targets


@pytest.mark.parametrize("function", SNAPSTART_FUNCTIONS)
def test_user_facing_functions_start_from_snapstart_snapshots_through_their_alias(
    translated: dict[str, Any], function: str
) -> None:
    properties = FUNCTIONS[function]
    assert properties["SnapStart"] == {"ApplyOn": "PublishedVersions"}
    assert properties["AutoPublishAlias"] == ALIAS
    # A new version for every change (an environment variable too), not only the code's.
    assert properties["AutoPublishAliasAllProperties"] is True
    # Python SnapStart: python3.12 and later.
    version = re.fullmatch(r"python3\.(\d+)", properties.get("Runtime", GLOBALS["Runtime"]))
    assert version and int(version.group(1)) >= 12

    resources = translated["Resources"]
    alias = f"{function}Alias{ALIAS}"
    assert resources[alias]["Type"] == "AWS::Lambda::Alias"
    assert resources[alias]["Properties"]["Name"] == ALIAS
    # Whatever users reach invokes the alias, never $LATEST (no snapshot there).
    targets = integration_targets(translated)
    for _, method, path in [r for r in HTTP_ROUTES if r[0] == function]:
        assert targets[(method, path)] == alias, (method, path)
    for resource in resources.values():
        if resource["Type"] == "AWS::Lambda::Permission":
            assert resource["Properties"]["FunctionName"] != {"Ref": function}, resource
    if function in URL_FUNCTIONS:
        assert resources[f"{function}Url"]["Properties"]["TargetFunctionArn"] == {"Ref": alias}


@pytest.mark.parametrize("function", STREAM_FUNCTIONS)
def test_the_web_adapter_relays_the_snapstart_hooks_to_the_stream_server(function: str) -> None:
    variables = FUNCTIONS[function]["Environment"]["Variables"]
    assert variables["AWS_LWA_SNAPSTART_BEFORE_CHECKPOINT_PATH"] == stream.BEFORE_CHECKPOINT_PATH
    assert variables["AWS_LWA_SNAPSTART_AFTER_RESTORE_PATH"] == stream.AFTER_RESTORE_PATH
    # The adapter relays the hooks from version 1.1.0: layer version 30 or later.
    (layer,) = FUNCTIONS[function]["Layers"]
    found = re.search(r":layer:LambdaAdapterLayer(Arm64|X86):(\d+)$", layer["Fn::Sub"])
    assert found and int(found.group(2)) >= 30, layer
    expected = {"arm64": "Arm64", "x86_64": "X86"}[GLOBALS["Architectures"][0]]
    assert found.group(1) == expected


def test_only_user_facing_functions_use_snapstart() -> None:
    for function in SCHEDULED_FUNCTIONS:
        assert "SnapStart" not in FUNCTIONS[function]
        assert "AutoPublishAlias" not in FUNCTIONS[function]
    assert set(SNAPSTART_FUNCTIONS) | set(SCHEDULED_FUNCTIONS) == set(FUNCTIONS)


@pytest.mark.parametrize("function", SCHEDULED_FUNCTIONS)
def test_failed_scheduled_runs_are_kept_and_alarmed(
    translated: dict[str, Any], function: str
) -> None:
    """The Scheduler invokes asynchronously: without a destination a failure vanishes."""
    queue = {"Fn::GetAtt": ["FailedInvocationsQueue", "Arn"]}
    invoke = FUNCTIONS[function]["EventInvokeConfig"]
    assert invoke["DestinationConfig"]["OnFailure"] == {"Type": "SQS", "Destination": queue}
    assert RESOURCES["FailedInvocationsQueue"]["Type"] == "AWS::SQS::Queue"
    # ...and what the Scheduler itself could not deliver.
    ((_, schedule),) = [(f, e) for f, e in events_of("ScheduleV2") if f == function]
    assert schedule["DeadLetterConfig"] == {"Arn": queue}

    alarms = [
        r["Properties"]
        for r in RESOURCES.values()
        if r["Type"] == "AWS::CloudWatch::Alarm"
        and r["Properties"]["Namespace"] == "AWS/Lambda"
        and r["Properties"]["MetricName"] == "Errors"
        and r["Properties"]["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": function}}]
    ]
    assert len(alarms) == 1, alarms
    (alarm,) = alarms
    assert alarm["Threshold"] == 1
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert alarm["TreatMissingData"] == "notBreaching"
    assert alarm["AlarmActions"] == {
        "Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]
    }

    # Deployed: the function's role may send to the queue, and so may the schedule's.
    resources = translated["Resources"]
    config = resources[f"{function}EventInvokeConfig"]["Properties"]
    assert config["DestinationConfig"]["OnFailure"]["Destination"] == queue
    for role in (f"{function}Role", f"{function}ScheduleRole"):
        statements = [
            statement
            for policy in resources[role]["Properties"]["Policies"]
            for statement in policy["PolicyDocument"]["Statement"]
        ]
        assert {"Action": "sqs:SendMessage", "Effect": "Allow", "Resource": queue} in statements


def test_two_stacks_can_share_an_account_and_region(translated: dict[str, Any]) -> None:
    """No fixed names: SAM names a ScheduleV2 schedule after the function unless OmitName."""
    for _, schedule in events_of("ScheduleV2"):
        assert schedule["OmitName"] is True
        assert "Name" not in schedule
    # Nothing else has a name of its own: CloudFormation makes them unique per stack.
    named = {
        "AWS::Lambda::Function": "FunctionName",
        "AWS::Scheduler::Schedule": "Name",
        "AWS::SQS::Queue": "QueueName",
        "AWS::CloudWatch::Alarm": "AlarmName",
        "AWS::Logs::LogGroup": "LogGroupName",
        "AWS::IAM::Role": "RoleName",
        "AWS::IAM::ManagedPolicy": "ManagedPolicyName",
    }
    for name, resource in translated["Resources"].items():
        key = named.get(resource["Type"])
        assert key is None or key not in resource.get("Properties", {}), f"{name}.{key} is fixed"


@pytest.mark.parametrize(
    ("function", "parameter"),
    [
        ("ChatFunction", "ChatReservedConcurrency"),
        ("ChatStreamFunction", "ChatStreamReservedConcurrency"),
        ("ExportFunction", "ExportReservedConcurrency"),
    ],
)
def test_reserved_concurrency_is_a_parameter_off_by_default(function: str, parameter: str) -> None:
    reserved = FUNCTIONS[function]["ReservedConcurrentExecutions"]
    (condition,) = [c for c, d in TEMPLATE_DATA["Conditions"].items() if parameter in json.dumps(d)]
    assert reserved == {"Fn::If": [condition, {"Ref": parameter}, {"Ref": "AWS::NoValue"}]}
    assert TEMPLATE_DATA["Conditions"][condition] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": parameter}, 0]}]
    }
    assert TEMPLATE_DATA["Parameters"][parameter]["Default"] == 0  # 0: none reserved
    assert evaluate(reserved, {}) is NO_VALUE
    assert evaluate(reserved, {condition: True}) == {"Ref": parameter}


def test_no_other_function_reserves_concurrency() -> None:
    for function in ("SessionsFunction", *SCHEDULED_FUNCTIONS):
        assert "ReservedConcurrentExecutions" not in FUNCTIONS[function]


XRAY_POLICY = "arn:aws:iam::aws:policy/AWSXrayWriteOnlyAccess"


@pytest.mark.parametrize("tracing", ["Disabled", "Active"])
def test_xray_is_granted_only_with_tracing_on(tracing: str) -> None:
    resources = translate({"EnableTracing": tracing})["Resources"]
    on = tracing == "Active"
    assert TEMPLATE_DATA["Parameters"]["EnableTracing"]["Default"] == "Disabled"
    for function in FUNCTIONS:
        role = resources[f"{function}Role"]["Properties"]
        assert (XRAY_POLICY in role["ManagedPolicyArns"]) is on, function
        tracing_config = resources[function]["Properties"].get("TracingConfig")
        assert (tracing_config == {"Mode": {"Ref": "EnableTracing"}}) is on, function
        variables = environment(function, {"UseSsm": False, "HasJwtSecret": False, "TracingOn": on})
        assert variables["POWERTOOLS_TRACE_DISABLED"] == ("false" if on else "true")


def test_tracing_needs_no_other_build() -> None:
    """The package always ships the X-Ray SDK Powertools Tracer imports (not botocore)."""
    script = BUILD_SCRIPT.read_text()
    found = re.search(r"^TRACER_REQUIREMENTS=\(([^)]*)\)$", script, re.M)
    assert found and "aws-xray-sdk" in found.group(1).split()
    lock = (ROOT / "infra" / "lambda-constraints.txt").read_text()
    assert re.search(r"^aws-xray-sdk==[^\s\\]+ \\\n\s+--hash=sha256:[0-9a-f]{64}", lock, re.M)
    assert TEMPLATE_DATA["Conditions"]["TracingOn"] == {
        "Fn::Equals": [{"Ref": "EnableTracing"}, "Active"]
    }


def condition_value(name: str, parameters: dict[str, str]) -> bool:
    """A condition as CloudFormation evaluates it, for these parameter values."""

    def value(node: Any) -> Any:
        if isinstance(node, str):
            return node
        ((function, argument),) = node.items()
        if function == "Ref":
            default = TEMPLATE_DATA["Parameters"][argument].get("Default")
            return parameters.get(argument, default)
        if function == "Condition":
            return condition_value(argument, parameters)
        if function == "Fn::Equals":
            return str(value(argument[0])) == str(value(argument[1]))
        if function == "Fn::Not":
            return not value(argument[0])
        if function == "Fn::And":
            return all(value(a) for a in argument)
        if function == "Fn::Or":
            return any(value(a) for a in argument)
        if function == "Fn::Split":
            return value(argument[1]).split(argument[0])
        if function == "Fn::Select":
            return value(argument[1])[int(argument[0])]
        raise AssertionError(f"unexpected in a condition: {function}")

    return bool(value(TEMPLATE_DATA["Conditions"][name]))


ARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:memchat/{}-AbCdEf"
SECRET_PARAMETERS = [
    "DatabaseUrlSecret",
    "CleanupDatabaseUrlSecret",
    "SummaryDatabaseUrlSecret",
    "OpenAiApiKeySecret",
    "EmbeddingApiKeySecret",
    "SupabaseJwtSecretSecret",
]
# Secret parameters that may be left empty (the setting is then not read).
OPTIONAL_SECRET_PARAMETERS = ["SupabaseJwtSecretSecret", "EmbeddingApiKeySecret"]


def secret_parameters(store: str) -> dict[str, str]:
    values = {
        name: (f"/memchat/{name}" if store == "ssm" else ARN.format(name))
        for name in SECRET_PARAMETERS
    }
    return {"SecretStore": store, **values}


@pytest.mark.parametrize("store", ["secretsmanager", "ssm"])
def test_secret_parameters_must_be_of_the_stores_kind(store: str) -> None:
    guard = RESOURCES["SecretParametersDoNotMatchSecretStore"]
    assert guard["Condition"] == "SecretsDoNotMatchStore"
    assert guard["Type"] == "AWS::CloudFormation::WaitCondition"  # fails: nothing signals it
    assert RESOURCES["SecretParametersDoNotMatchSecretStoreHandle"]["Condition"] == (
        "SecretsDoNotMatchStore"
    )

    right = secret_parameters(store)
    assert not condition_value("SecretsDoNotMatchStore", right)
    for optional in OPTIONAL_SECRET_PARAMETERS:
        assert not condition_value("SecretsDoNotMatchStore", {**right, optional: ""}), optional
        assert TEMPLATE_DATA["Parameters"][optional]["Default"] == ""
    other = secret_parameters("ssm" if store == "secretsmanager" else "secretsmanager")
    for name in SECRET_PARAMETERS:
        wrong = {**right, name: other[name]}
        assert condition_value("SecretsDoNotMatchStore", wrong), name
    # Each parameter's own pattern still admits both kinds (the store decides which).
    for name in SECRET_PARAMETERS:
        pattern = re.compile(TEMPLATE_DATA["Parameters"][name]["AllowedPattern"])
        assert pattern.fullmatch(right[name]) and pattern.fullmatch(other[name]), name


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("*", True),
        ("https://chat.example.com", True),
        ("http://localhost:3000", True),
        ("https://app.example.co.uk:8443", True),
        ("https://chat.example.com/", False),
        ("https://chat.example.com/app", False),
        ("chat.example.com", False),
        ("https://a.example.com,https://b.example.com", False),
        ("https://", False),
        ("", False),
    ],
)
def test_cors_allow_origin_must_be_an_origin(origin: str, allowed: bool) -> None:
    pattern = TEMPLATE_DATA["Parameters"]["CorsAllowOrigin"]["AllowedPattern"]
    assert bool(re.fullmatch(pattern, origin)) is allowed


def test_the_deploy_guide_counts_the_guided_deploys_questions() -> None:
    """`sam deploy --guided` asks once per API route and once per function URL."""
    guide = (ROOT / "docs" / "deploy.md").read_text()
    asked = re.search(r"for each function URL \((\d+) times\)", guide)
    assert asked, "docs/deploy.md no longer counts the 'no authentication' questions"
    assert int(asked.group(1)) == len(HTTP_ROUTES) + len(URL_FUNCTIONS)
    sessions = re.search(r"\(once per route: (\d+) times\)", guide)
    assert sessions
    assert int(sessions.group(1)) == len([r for r in HTTP_ROUTES if r[0] == "SessionsFunction"])
