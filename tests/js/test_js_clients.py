"""The JavaScript clients (tests/js/clients.test.mjs) against `memchat dev`.

`npm ci` installs the locked packages (package-lock.json: the official
`openai` package, the Vercel AI SDK's `ai` and `@ai-sdk/openai`), then Node's
own test runner runs them against a server started here with the offline
responder, each test with a fresh user's token. Without Node 20+ and npm
this test fails, saying what to install: it never passes or skips silently.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.utils.dev_server import DevServer, dev_server

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


def test_javascript_clients(offline_dev: DevServer) -> None:
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

    tokens = [offline_dev.token() for _ in range(TESTS)]
    env = {
        **os.environ,
        "MEMCHAT_URL": offline_dev.url,
        "MEMCHAT_TOKENS": ",".join(tokens),
        "NO_COLOR": "1",
    }
    run = subprocess.run(
        [node, "--test", "--test-concurrency=1", "--test-reporter=tap", "clients.test.mjs"],
        cwd=JS_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    # Every test ran and passed: a file that loaded no test would pass too.
    assert re.search(rf"^# pass {TESTS}$", run.stdout, re.M), report
    assert re.search(r"^# fail 0$", run.stdout, re.M), report
