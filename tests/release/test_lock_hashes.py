"""The Lambda package's dependencies are the lock's files, checked by their sha256.

infra/lambda-constraints.txt pins every dependency of the deployed package
with == and lists the sha256 of each file pip may pick for it (CPython 3.12
manylinux wheels, arm64 and x86_64); infra/build_lambda.sh installs it with
`pip install --require-hashes --no-deps -r`, then memchat itself (built from
this tree, nothing to check a hash against) with --no-deps --no-index, and
fails unless the lock is exactly the package's dependency closure. Without
hashes, anyone able to serve a different file for a pinned version (a
compromised index, mirror, proxy or maintainer account re-uploading) would
ship it in every function.

Here: the lock's form; the build's install lines; pip, run by the build
itself against altered copies of the lock, refusing a file whose hash is not
listed and a requirement that is not pinned; the closure check refusing a
lock that lacks a dependency; and, for each architecture, pip picking a file
the lock lists (the x86_64 build in test_package.py installs one; nothing
here can install arm64 wheels, so pip's choice is read from a dry run).
These need PyPI, as the build does.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.release.test_package import (
    BUILD_SCRIPT,
    LOCK,
    ROOT,
    RUNTIME,
    canonical,
    lock_entries,
    runtime_python,
)

MACHINES = ("aarch64", "x86_64")
SCRIPT = BUILD_SCRIPT.read_text()


@pytest.fixture(scope="module")
def python() -> str:
    return runtime_python()


def script_commands() -> list[str]:
    """The build script's commands, continuation lines joined, comments dropped."""
    joined = SCRIPT.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if not line.lstrip().startswith("#")]


def build_with_lock(python: str, lock_text: str, tmp_path: Path) -> tuple[str, Path]:
    """Run infra/build_lambda.sh (x86_64) with this lock; its output, and the package dir."""
    lock = tmp_path / "lock.txt"
    lock.write_text(lock_text)
    out = tmp_path / "lambda"
    command = ["bash", str(BUILD_SCRIPT), "--arch", "x86_64", "--no-zip", "--out", str(out)]
    result = subprocess.run(
        [*command, "--lock", str(lock)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": python},
        timeout=900,
        check=False,
    )
    assert result.returncode != 0, "the build accepted the altered lock:\n" + result.stdout
    return result.stdout + result.stderr, out


def test_every_pin_has_sha256_hashes() -> None:
    """A pin without a hash lets any file with that name and version through."""
    entries = lock_entries(LOCK.read_text())
    assert len(entries) > 10, entries
    for name, (_, hashes) in entries.items():
        assert hashes, f"{name} has no --hash=sha256:..."
        # As --update-constraints writes them: sorted, so that the same files
        # give the same lock and a review's diff shows only what changed.
        assert hashes == sorted(set(hashes)), name
    assert list(entries) == sorted(entries)
    # The platform-specific wheels are there for both architectures (one
    # hash per architecture at least), not only for the machine that wrote it.
    for native in ("pydantic-core", "psycopg-binary"):
        assert len(entries[native][1]) >= 2, native


def test_the_build_installs_the_lock_with_require_hashes() -> None:
    """Two installs only: the lock, hash-checked and without dependencies; then memchat alone."""
    installs = [
        command
        for command in script_commands()
        if re.search(r"\bpip\b.*\binstall\b|PIP\[@\]\}\"? install\b", command)
        and "--dry-run" not in command  # --update-*: resolves, installs nothing
    ]
    assert len(installs) == 2, installs
    dependencies, memchat = installs
    options = shlex.split(dependencies)
    assert "--require-hashes" in options and "--no-deps" in options, dependencies
    assert options[-2:] == ["-r", "$LOCK"], dependencies
    assert "-c" not in options and "--constraint" not in options, dependencies
    memchat_options = shlex.split(memchat)
    assert memchat_options[-1] == "${WHEELS[0]}", memchat  # the wheel built from this tree
    assert "--no-deps" in memchat_options and "--no-index" in memchat_options, memchat
    assert "-r" not in memchat_options, memchat
    assert re.search(r'^LOCK="\$ROOT/infra/lambda-constraints.txt"$', SCRIPT, re.M)


def test_pip_refuses_a_file_whose_hash_the_lock_does_not_list(python: str, tmp_path: Path) -> None:
    """A tampered (or re-uploaded) file: the lock's hash for it is not the file's."""
    text = LOCK.read_text()
    entries = lock_entries(text)
    # A pure-Python wheel: one file for every platform, so its one hash is
    # the file this build must install.
    name, (version, (digest,)) = next(
        (name, entry) for name, entry in entries.items() if len(entry[1]) == 1
    )
    tampered = hashlib.sha256(b"not the file the lock was written from").hexdigest()
    assert text.count(digest) == 1
    output, out = build_with_lock(python, text.replace(digest, tampered), tmp_path)
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in output, output
    assert f"Expected sha256 {tampered}" in output, output
    assert f"{name}=={version}" in output.replace("_", "-"), output
    assert not any(out.iterdir()), "something was installed"


def test_pip_refuses_a_requirement_without_a_pin(python: str, tmp_path: Path) -> None:
    """A requirement that pip would resolve itself (whatever the index serves today)."""
    text = LOCK.read_text().rstrip("\n") + "\nsix\n"
    output, out = build_with_lock(python, text, tmp_path)
    assert "all requirements must have their versions pinned with ==" in output, output
    assert not any(out.iterdir()), "something was installed"


def test_the_build_refuses_a_lock_that_lacks_a_dependency(python: str, tmp_path: Path) -> None:
    """pip installs the lock with --no-deps: the build must catch a dependency missing from it."""
    dependency = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"][0]
    name = canonical(re.split(r"[\[<>=!~; ]", dependency, maxsplit=1)[0])
    text = LOCK.read_text()
    without = re.sub(rf"(?im)^{re.escape(name)}==\S+ \\\n(?:[ \t]+--hash=\S+(?: \\)?\n)+", "", text)
    assert without != text and name not in lock_entries(without)
    output, _ = build_with_lock(python, without, tmp_path)
    assert f"memchat requires {dependency}" in output, output
    assert "which the lock does not pin" in output, output


def test_the_build_refuses_a_lock_without_the_mcp_sdk(python: str, tmp_path: Path) -> None:
    """Without the MCP SDK the deployed POST /mcp would answer 501: the build fails."""
    text = LOCK.read_text()
    without = re.sub(r"(?im)^mcp==\S+ \\\n(?:[ \t]+--hash=\S+(?: \\)?\n)+", "", text)
    assert without != text and "mcp" not in lock_entries(without)
    output, _ = build_with_lock(python, without, tmp_path)
    assert "the MCP SDK is not in the package" in output, output


def wheel_target(machine: str, target: Path) -> list[str]:
    """The build's pip options for the runtime's wheels on this machine (its wheel_target)."""
    function = r"^wheel_target\(\) \{.*?\n\s*WHEEL_TARGET=\((.*?)\)\n\}"
    found = re.search(function, SCRIPT, re.S | re.M)
    assert found, "infra/build_lambda.sh has no wheel_target function"
    options = found.group(1).replace("$PYTHON_VERSION", RUNTIME)
    return shlex.split(options.replace("$1", machine).replace("$2", str(target)))


@pytest.mark.parametrize("machine", MACHINES)
def test_the_lock_has_the_file_pip_installs_on(python: str, machine: str, tmp_path: Path) -> None:
    """Each architecture's build finds a file whose hash the lock lists, for every pin."""
    report = tmp_path / "report.json"
    pip = [python, "-m", "pip", "install", "--quiet", "--dry-run", "--no-deps"]
    result = subprocess.run(
        [*pip, "--report", str(report), *wheel_target(machine, tmp_path / "t"), "-r", str(LOCK)],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    entries = lock_entries(LOCK.read_text())
    picked = {}
    for item in json.loads(report.read_text())["install"]:
        name = canonical(item["metadata"]["name"])
        url = item["download_info"]["url"]
        digest = item["download_info"]["archive_info"]["hashes"]["sha256"]
        picked[name] = item["metadata"]["version"]
        assert digest in entries[name][1], f"{machine}: {url} is not in the lock"
        wheel = url.rsplit("/", 1)[-1]
        assert wheel.endswith(".whl") and (machine in wheel or wheel.endswith("-any.whl")), url
    assert picked == {name: version for name, (version, _) in entries.items()}
