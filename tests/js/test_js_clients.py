"""The JavaScript clients (tests/js/*.test.mjs) against `memchat dev`.

`npm ci` installs the locked packages (package-lock.json: the official
`openai` package, the Vercel AI SDK's `ai` and `@ai-sdk/openai`), then Node's
own test runner runs them: clients.test.mjs against a server started here
with the offline responder, each test with a fresh user's token;
chats.test.mjs against one backed by the fake model, whose requests are
checked here afterwards. Without Node 20+ and npm these tests fail, saying
what to install: they never pass or skip silently.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.utils.chat_api import conversation
from tests.utils.dev_server import DevServer, dev_server
from tests.utils.fake_openai import FakeOpenAI

JS_DIR = Path(__file__).resolve().parent
TESTS = 5  # the tests in clients.test.mjs
NODE_MAJOR = 20


@pytest.fixture(scope="module")
def offline_dev(admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """`memchat dev` with no model key: the offline responder answers."""
    with dev_server(admin_url, tmp_path_factory.mktemp("js-dev")) as running:
        yield running


def _tool(name: str) -> str:
    found = shutil.which(name)
    assert found, (
        f"{name} is not installed: the JavaScript client tests (tests/js) need Node"
        f" {NODE_MAJOR}+ and npm (Debian: apt-get install nodejs npm)"
    )
    return found


def _npm_ci() -> str:
    """Node's path, once the locked packages are installed."""
    node, npm = _tool("node"), _tool("npm")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    major = int(version.stdout.strip().lstrip("v").split(".")[0])
    assert major >= NODE_MAJOR, f"Node {NODE_MAJOR}+ is needed, found {version.stdout.strip()}"

    installed = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--prefer-offline"],
        cwd=JS_DIR,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return node


def _node_test(node: str, file: str, tests: int, env: dict[str, str]) -> None:
    """Run one test file with Node's runner; every one of its `tests` passed."""
    run = subprocess.run(
        [node, "--test", "--test-concurrency=1", "--test-reporter=tap", file],
        cwd=JS_DIR,
        env={**os.environ, **env, "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    # Every test ran and passed: a file that loaded no test would pass too.
    assert re.search(rf"^# pass {tests}$", run.stdout, re.M), report
    assert re.search(r"^# fail 0$", run.stdout, re.M), report


def test_javascript_clients(offline_dev: DevServer) -> None:
    node = _npm_ci()
    tokens = [offline_dev.token() for _ in range(TESTS)]
    env = {"MEMCHAT_URL": offline_dev.url, "MEMCHAT_TOKENS": ",".join(tokens)}
    _node_test(node, "clients.test.mjs", TESTS, env)


def test_javascript_chats_and_their_parameters(dev: DevServer, dev_model: FakeOpenAI) -> None:
    """Two chats at once from the openai package, as Open WebUI calls: what
    reached the model was one chat's exchanges per request, with the
    client's max_tokens and temperature."""
    node = _npm_ci()
    _node_test(node, "chats.test.mjs", 2, {"MEMCHAT_URL": dev.url, "MEMCHAT_TOKEN": dev.token()})
    chats = [r for r in dev_model.requests if ": message " in r["messages"][-1]["content"]]
    assert len(chats) == 6
    for request in chats:
        # The memory block (recalled exchanges of other sessions) aside.
        said = {text.removeprefix("echo: ").split(":")[0] for _, text in conversation(request)}
        assert len(said) == 1, request["messages"]
        assert (request["max_tokens"], request["temperature"]) == (32, 0.7)
    assert len(dev_model.suggestion_requests) == 2
