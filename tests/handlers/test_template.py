"""template.yaml: lint-clean, and every function, route and secret in it is real.

Each handler the template names is imported and invoked here: the HTTP ones
once per route the template gives them (unauthenticated, so 401 proves the
app serves that route behind auth), the cleanup one with the schedule's own
input. The template's routes must be exactly the app's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cfnlint.decode import decode

from memchat import secrets
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


def handler_module(properties: dict[str, Any]) -> str:
    handler = properties.get("Handler", GLOBALS.get("Handler"))
    module, _, attribute = handler.rpartition(".")
    assert module.startswith(HANDLER_PREFIX) and attribute == "handler", handler
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
    routes = output["Resources"]["HttpApi"]["Properties"]["Body"]["paths"]
    assert {(m.upper(), p) for p, ms in routes.items() for m in ms} == {
        (m, p) for _, m, p in HTTP_ROUTES
    }
    assert "CleanupFunctionSchedule" in output["Resources"]


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
        if path.stem not in {"__init__", "http"}
    }
    assert deployed == on_disk == {"chat", "clear", "export", "cleanup"}


async def test_template_routes_are_the_apps_routes(settings) -> None:
    from memchat.api.main import create_app

    app = create_app(settings)
    paths = app.openapi()["paths"]
    await app.state.memchat.close()
    served = {(method.upper(), path) for path, methods in paths.items() for method in methods}
    declared = [(method, path) for _, method, path in HTTP_ROUTES]
    assert len(declared) == len(set(declared)), "a route is declared twice"
    assert set(declared) == served


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
