"""template.yaml: lint-clean, and every function, route and secret in it is real.

Each handler the template names is imported and invoked here: the API
Gateway ones once per route the template gives them (unauthenticated, so 401
proves the app serves that route behind auth), the export function's server
once per route its function URL serves, the cleanup one with the schedule's
own input. Every route of the app is served by exactly one of the HTTP API
and the export function URL.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from cfnlint.decode import decode

from memchat import secrets
from memchat.handlers import stream
from tests.handlers.conftest import FakeContext, LambdaRuntime, body_of, route_event

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
BUILD_SCRIPT = ROOT / "infra" / "build_lambda.sh"
HANDLER_PREFIX = "memchat.handlers."


def load_template() -> dict[str, Any]:
    template, errors = decode(str(TEMPLATE))
    assert not errors and template is not None, errors
    return dict(template)


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
# The export function URL serves what its server (memchat.handlers.stream) lets through.
URL_ROUTES = [("ExportFunction", method, path) for method, path in sorted(stream.EXPORT_ROUTES)]


def test_cfn_lint_is_clean() -> None:
    cfn_lint = Path(sys.executable).with_name("cfn-lint")
    command = str(cfn_lint) if cfn_lint.exists() else shutil.which("cfn-lint")
    assert command, "cfn-lint is not installed (it is in the test extras)"
    result = subprocess.run(
        [command, str(TEMPLATE)], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_sam_translates_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `sam deploy` sends: the SAM transform must accept the template."""
    from samtranslator.translator.transform import transform

    class Policies:
        def load(self) -> dict[str, str]:
            return {
                "AWSLambdaBasicExecutionRole": "arn:aws:iam::aws:policy/service-role/"
                "AWSLambdaBasicExecutionRole",
                "AWSXrayWriteOnlyAccess": "arn:aws:iam::aws:policy/AWSXrayWriteOnlyAccess",
            }

    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    template = json.loads(json.dumps(TEMPLATE_DATA))
    template["Globals"]["Function"]["CodeUri"] = "s3://bucket/memchat.zip"  # as `sam package` does
    output = transform(template, {}, Policies())
    resources = output["Resources"]
    routes = resources["HttpApi"]["Properties"]["Body"]["paths"]
    assert {(m.upper(), p) for p, ms in routes.items() for m in ms} == {
        (m, p) for _, m, p in HTTP_ROUTES
    }
    assert "CleanupFunctionSchedule" in resources
    url = resources["ExportFunctionUrl"]
    assert url["Type"] == "AWS::Lambda::Url"
    assert url["Properties"]["InvokeMode"] == "RESPONSE_STREAM"
    assert url["Properties"]["AuthType"] == "NONE"
    # Function URLs created since October 2025 need both permissions to be public.
    permissions = {
        r["Properties"]["Action"]: r["Properties"]
        for r in resources.values()
        if r["Type"] == "AWS::Lambda::Permission"
        and r["Properties"]["FunctionName"] == {"Ref": "ExportFunction"}
    }
    assert permissions["lambda:InvokeFunctionUrl"]["FunctionUrlAuthType"] == "NONE"
    assert permissions["lambda:InvokeFunction"]["InvokedViaFunctionUrl"] is True


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
    assert deployed == on_disk == {"chat", "clear", "stream", "cleanup"}


async def test_template_routes_are_the_apps_routes(settings) -> None:
    from memchat.api.main import create_app

    app = create_app(settings)
    paths = app.openapi()["paths"]
    await app.state.memchat.close()
    served = {(method.upper(), path) for path, methods in paths.items() for method in methods}
    declared = [(method, path) for _, method, path in [*HTTP_ROUTES, *URL_ROUTES]]
    # Each route through exactly one door: the HTTP API or the export function URL.
    assert len(declared) == len(set(declared)), "a route is served twice"
    assert set(declared) == served


def test_the_exports_are_streamed_from_a_function_url() -> None:
    """Through API Gateway a Lambda response is buffered and capped at 6 MB."""
    assert URL_FUNCTIONS == ["ExportFunction"]
    export = FUNCTIONS["ExportFunction"]
    assert "Events" not in export
    assert export["FunctionUrlConfig"]["AuthType"] == "NONE"  # the app checks the token
    assert export["FunctionUrlConfig"]["InvokeMode"] == "RESPONSE_STREAM"
    assert export["Timeout"] > 29  # no API Gateway 30 s limit in front of it

    # The AWS Lambda Web Adapter layer, for the template's architecture, runs run.sh.
    assert export["Handler"] == "run.sh"
    (layer,) = export["Layers"]
    arch = {"arm64": "Arm64", "x86_64": "X86"}[GLOBALS["Architectures"][0]]
    assert re.fullmatch(
        rf"arn:aws:lambda:\$\{{AWS::Region\}}:753240598075:layer:LambdaAdapterLayer{arch}:\d+",
        layer["Fn::Sub"],
    ), layer
    variables = export["Environment"]["Variables"]
    assert variables["AWS_LAMBDA_EXEC_WRAPPER"] == "/opt/bootstrap"
    assert variables["AWS_LWA_INVOKE_MODE"] == "response_stream"
    assert variables["AWS_LWA_READINESS_CHECK_PATH"] == stream.READINESS_PATH
    assert int(variables.get("AWS_LWA_PORT", stream.DEFAULT_PORT)) == stream.DEFAULT_PORT

    # The browser calls it from the same origin as the API.
    cors = export["FunctionUrlConfig"]["Cors"]
    api_cors = RESOURCES["HttpApi"]["Properties"]["CorsConfiguration"]
    assert cors["AllowOrigins"] == api_cors["AllowOrigins"] == [{"Ref": "CorsAllowOrigin"}]
    assert cors["AllowMethods"] == ["GET"]
    assert "authorization" in cors["AllowHeaders"]
    assert "content-disposition" in cors["ExposeHeaders"]
    assert TEMPLATE_DATA["Outputs"]["ExportUrl"]["Value"] == {
        "Fn::GetAtt": ["ExportFunctionUrl", "FunctionUrl"]
    }


def test_run_sh_starts_the_stream_server() -> None:
    script = run_sh()
    assert script.startswith("#!/bin/bash\n")
    assert 'cd "$LAMBDA_TASK_ROOT"' in script
    assert script.rstrip().endswith("exec python -m memchat.handlers.stream")
    assert re.search(r'^chmod 0755 "\$OUT/run.sh"$', BUILD_SCRIPT.read_text(), re.M)


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
    cleanup = FUNCTIONS["CleanupFunction"]
    assert cleanup["Policies"] == [{"Ref": "ReadDatabaseUrlPolicy"}]


@pytest.mark.parametrize(
    ("function", "method", "path"), HTTP_ROUTES, ids=[f"{m} {p}" for _, m, p in HTTP_ROUTES]
)
def test_each_http_route_reaches_its_handler(
    lambda_: LambdaRuntime, function: str, method: str, path: str
) -> None:
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
        assert body_of(response)["error"] == "unauthorized"


@pytest.mark.parametrize(
    ("function", "method", "path"), URL_ROUTES, ids=[f"{m} {p}" for _, m, p in URL_ROUTES]
)
def test_each_function_url_route_reaches_the_stream_server(
    lambda_: LambdaRuntime, function: str, method: str, path: str
) -> None:
    concrete = path.replace("{session_id}", "6f1c1d2e-4b7a-4c3e-9a51-2f0e8d9c7b10")
    server = lambda_.load(handler_module(FUNCTIONS[function]))

    async def call() -> list[httpx.Response]:
        app = server.create_stream_app()
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
    assert response.json()["error"] == "unauthorized"
    assert readiness.status_code == 200, readiness.text


def test_the_schedule_input_drives_the_cleanup_handler(lambda_: LambdaRuntime) -> None:
    ((function, schedule),) = events_of("ScheduleV2")
    event = json.loads(schedule["Input"])  # placeholders are filled in by the Scheduler
    assert event["dry_run"] is False
    result = lambda_.invoke(
        handler_module(FUNCTIONS[function]), event, FakeContext(function_name=function)
    )
    assert set(result) == {
        "deleted_sessions",
        "deleted_messages",
        "batches",
        "duration_ms",
        "finished",
    }
