"""The Lambda package as Lambda runs it: no stale byte-code, only the locked files.

`sam deploy` zips each function's build with every entry dated 1980-01-01
(samcli.lib.package.utils.make_zip_with_permissions: a bare
`zipfile.ZipInfo(name)`), and Lambda unpacks it into a read-only /var/task
with those dates. A timestamp-checked .pyc (what pip writes) records its
source's modification time at build time, never 1980, so in Lambda every one
would be stale: each cold start would compile every module it imports again
(and fail to write the result). infra/build_lambda.sh therefore compiles
hash-based byte-code that is not checked against the source
(`compileall --invalidation-mode unchecked-hash`).

Here the package is built as `sam build` builds it (x86_64, to run it on
this machine; the architecture changes no byte-code), zipped as SAM zips it,
unpacked as Lambda unpacks it (files dated as in the zip, read-only), and a
fresh interpreter of the runtime's version (python3.12) imports the chat
handler from it with the import system's source compiler watched: nothing on
the handler's import path may be compiled from source, and nothing may be
written. The same check, given timestamp byte-code, catches it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "infra" / "build_lambda.sh"
# The lock: every dependency pinned with == and the sha256 of its files.
LOCK = ROOT / "infra" / "lambda-constraints.txt"
RUNTIME_VERSION = re.search(r'^PYTHON_VERSION="([\d.]+)"', BUILD_SCRIPT.read_text(), re.M)
assert RUNTIME_VERSION, "infra/build_lambda.sh names no PYTHON_VERSION"
RUNTIME = RUNTIME_VERSION.group(1)
HANDLER_MODULE = "memchat.handlers.chat"
SAM_ZIP_DATE = (1980, 1, 1, 0, 0, 0)

# Run in the runtime's Python with the unpacked package first on sys.path:
# imports the handler with SourceLoader.source_to_code (what the import
# system calls when a module has no valid byte-code) watched.
IMPORT_PROBE = """
import importlib._bootstrap_external as external, json, sys
root = sys.argv[1]
compiled = []
source_to_code = external.SourceLoader.source_to_code
def watched(self, data, path, *args, **kwargs):
    compiled.append(path)
    return source_to_code(self, data, path, *args, **kwargs)
external.SourceLoader.source_to_code = watched
import importlib
importlib.import_module(sys.argv[2])
loaded = sorted(
    m.__file__ for m in list(sys.modules.values())
    if isinstance(getattr(m, "__file__", None), str) and m.__file__.startswith(root)
)
print(json.dumps({
    "compiled": compiled,
    "loaded": loaded,
    "dont_write_bytecode": sys.dont_write_bytecode,
}))
"""

# Every .pyc in the package, read as the runtime's importlib reads it.
PYC_PROBE = """
import importlib.util, json, os, sys
root = sys.argv[1]
report = {"pyc": 0, "not_unchecked_hash": [], "wrong_hash": [], "missing": []}
for top, dirs, files in os.walk(root):
    for name in files:
        if name.endswith(".py") and os.path.basename(top) != "__pycache__":
            source = os.path.join(top, name)
            cached = importlib.util.cache_from_source(source)
            if not os.path.exists(cached):
                report["missing"].append(source)
                continue
            report["pyc"] += 1
            with open(cached, "rb") as f:
                header = f.read(16)
            flags = int.from_bytes(header[4:8], "little")
            # PEP 552: bit 0 hash-based, bit 1 check_source; unchecked-hash is 0b01.
            if header[:4] != importlib.util.MAGIC_NUMBER or flags != 0b01:
                report["not_unchecked_hash"].append(cached)
            with open(source, "rb") as f:
                if header[8:16] != importlib.util.source_hash(f.read()):
                    report["wrong_hash"].append(cached)
print(json.dumps(report))
"""


def runtime_python() -> str:
    """A python3.12, found as infra/build_lambda.sh finds one."""
    candidates = [os.environ.get("PYTHON", ""), shutil.which(f"python{RUNTIME}") or ""]
    if shutil.which("pyenv"):
        prefix = subprocess.run(
            ["pyenv", "prefix", RUNTIME], capture_output=True, text=True, check=False
        ).stdout.strip()
        if prefix:
            candidates.append(str(Path(prefix) / "bin" / f"python{RUNTIME}"))
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip() == RUNTIME:
            return candidate
    pytest.fail(
        f"no Python {RUNTIME} (the Lambda runtime's) here: the package cannot be byte-compiled"
        f" or imported as deployed. Install python{RUNTIME} or set PYTHON=/path/to/it."
    )


def sam_zip(source: Path, target: Path) -> None:
    """Zip a build directory as `sam deploy` does (make_zip_with_permissions)."""
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for top, _, files in os.walk(source, followlinks=True):
            for name in files:
                path = Path(top) / name
                info = zipfile.ZipInfo(str(path.relative_to(source)))  # dated 1980-01-01
                info.create_system = 3
                info.external_attr = path.stat().st_mode << 16
                archive.writestr(info, path.read_bytes(), compress_type=zipfile.ZIP_DEFLATED)


def lambda_unzip(archive_path: Path, target: Path) -> None:
    """Unpack as Lambda does: each file dated and moded as in the zip, then read-only."""
    with zipfile.ZipFile(archive_path) as archive:
        for info in archive.infolist():
            path = Path(archive.extract(info, target))
            mode = info.external_attr >> 16
            if mode:
                path.chmod(stat.S_IMODE(mode))
            stamp = time.mktime((*info.date_time, 0, 0, -1))
            os.utime(path, (stamp, stamp))
    set_writable(target, writable=False)


def set_writable(root: Path, *, writable: bool) -> None:
    for top, dirs, files in os.walk(root):
        for name in [*dirs, *files, "."]:
            path = Path(top) / name
            mode = stat.S_IMODE(path.lstat().st_mode)
            path.chmod(mode | stat.S_IWUSR if writable else mode & ~0o222)


def snapshot(root: Path) -> dict[str, tuple[int, float]]:
    return {
        str(path.relative_to(root)): (path.stat().st_size, path.stat().st_mtime)
        for path in root.rglob("*")
        if path.is_file()
    }


def import_in_runtime(
    python: str, search_path: list[Path], root: Path, module: str = HANDLER_MODULE
) -> dict[str, Any]:
    """Import `module` (the chat handler: as ChatFunction's init does) in a
    fresh runtime interpreter."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root.parent),
        "LANG": "C.UTF-8",
        "PYTHONPATH": os.pathsep.join(map(str, search_path)),
        "LAMBDA_TASK_ROOT": str(root),
        # Byte-code writing stays on, as in Lambda: it would try (and fail) to write.
        "ROUTE_GROUPS": "chat",
        # Nothing listens there: the start-up check of the embedding column gives up at once.
        "DATABASE_URL": "postgresql://memchat_api@127.0.0.1:9/postgres",
        "SUPABASE_JWT_SECRET": "release-test-secret-0123456789abcdef0123",
        "OPENAI_API_KEY": "sk-release-test-0123456789abcdef",
        "POWERTOOLS_SERVICE_NAME": "memchat",
        "POWERTOOLS_METRICS_NAMESPACE": "memchat",
        "POWERTOOLS_TRACE_DISABLED": "true",
        "LOG_LEVEL": "ERROR",
    }
    result = subprocess.run(
        # -P: the search path is PYTHONPATH's alone (not the working directory first).
        [python, "-P", "-c", IMPORT_PROBE, str(root), module],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


@pytest.fixture(scope="module")
def python() -> str:
    return runtime_python()


@pytest.fixture(scope="module")
def package(python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package, built as `sam build` builds it (but for this machine's architecture)."""
    out = tmp_path_factory.mktemp("build") / "lambda"
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--arch", "x86_64", "--no-zip", "--out", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": python},
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "byte-code: unchecked-hash" in result.stdout, result.stdout + result.stderr
    return out


@pytest.fixture(scope="module")
def deployed(package: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The package zipped as SAM zips it and unpacked as Lambda unpacks it (/var/task)."""
    work = tmp_path_factory.mktemp("deploy")
    sam_zip(package, work / "function.zip")
    task_root = work / "task"
    lambda_unzip(work / "function.zip", task_root)
    yield task_root
    set_writable(task_root, writable=True)  # so that pytest can remove it


def test_sam_zips_every_file_dated_1980(package: Path, tmp_path: Path) -> None:
    """What makes timestamp byte-code stale: the zip keeps no file's real date."""
    sam_zip(package / "memchat" / "handlers", tmp_path / "handlers.zip")
    with zipfile.ZipFile(tmp_path / "handlers.zip") as archive:
        assert {info.date_time for info in archive.infolist()} == {SAM_ZIP_DATE}
    built = package / "memchat" / "handlers" / "chat.py"
    assert time.localtime(built.stat().st_mtime)[:6] != SAM_ZIP_DATE


def test_every_module_has_unchecked_hash_byte_code(python: str, deployed: Path) -> None:
    result = subprocess.run(
        [python, "-c", PYC_PROBE, str(deployed)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["pyc"] > 1000, report["pyc"]
    assert report["missing"] == []
    assert report["not_unchecked_hash"] == []
    # ...compiled from these very sources: valid even if someone checked them.
    assert report["wrong_hash"] == []


def test_the_chat_handler_imports_without_compiling_anything(python: str, deployed: Path) -> None:
    before = snapshot(deployed)
    report = import_in_runtime(python, [deployed], deployed)
    assert report["dont_write_bytecode"] is False  # as in Lambda: it would write if it could
    loaded = [Path(f).relative_to(deployed).as_posix() for f in report["loaded"]]
    # The handler's import path: the app, its web stack, Powertools, the database driver.
    for expected in (
        "memchat/handlers/chat.py",
        "memchat/api/main.py",
        "fastapi/applications.py",
        "pydantic/main.py",
        "mangum/adapter.py",
        "aws_lambda_powertools/logging/logger.py",
        "psycopg/connection.py",
    ):
        assert expected in loaded, expected
    assert report["compiled"] == [], report["compiled"]
    assert snapshot(deployed) == before  # nothing written, nothing touched
    # The MCP SDK ships, but loads only when POST /mcp is first requested.
    assert not [f for f in loaded if f.startswith(("mcp/", "mcp_types/"))]


def test_the_package_serves_mcp(python: str, deployed: Path) -> None:
    """The MCP SDK (the `mcp` extra) is in the package, so the deployed POST /mcp
    answers MCP instead of 501 mcp_unavailable: what it imports on the first
    request loads from the package's byte-code."""
    report = import_in_runtime(python, [deployed], deployed, "mcp.server.mcpserver")
    loaded = [Path(f).relative_to(deployed).as_posix() for f in report["loaded"]]
    assert "mcp/server/mcpserver/__init__.py" in loaded, loaded
    assert report["compiled"] == [], report["compiled"]


def test_the_same_check_catches_timestamp_byte_code(
    python: str, deployed: Path, tmp_path: Path
) -> None:
    """memchat with pip's kind of byte-code (timestamps), dated as SAM's zip dates it."""
    stale = tmp_path / "stale"
    shutil.copytree(deployed / "memchat", stale / "memchat")
    set_writable(stale, writable=True)
    for cache in (stale / "memchat").rglob("__pycache__"):
        shutil.rmtree(cache)
    for source in (stale / "memchat").rglob("*.py"):
        os.utime(source)  # dated when built, as pip's sources are
    compiled = subprocess.run(
        [python, "-m", "compileall", "-q", "--invalidation-mode", "timestamp", str(stale)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    dated_1980 = time.mktime((*SAM_ZIP_DATE, 0, 0, -1))
    for source in (stale / "memchat").rglob("*.py"):
        os.utime(source, (dated_1980, dated_1980))

    report = import_in_runtime(python, [stale, deployed], deployed)

    recompiled = {Path(p).relative_to(stale).as_posix() for p in report["compiled"]}
    assert "memchat/handlers/chat.py" in recompiled
    assert "memchat/api/main.py" in recompiled
    assert all(path.startswith("memchat/") for path in recompiled), recompiled


def shipped_distributions(package: Path) -> dict[str, str]:
    shipped = {}
    for metadata in package.glob("*.dist-info/METADATA"):
        headers = metadata.read_text(encoding="utf-8").split("\n\n", 1)[0]
        fields = dict(line.split(": ", 1) for line in headers.splitlines() if ": " in line)
        shipped[canonical(fields["Name"])] = fields["Version"]
    return shipped


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


HASH_OPTION = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def lock_entries(text: str) -> dict[str, tuple[str, list[str]]]:
    """A lock file's requirements, read as pip reads them: name -> (version, sha256s).

    Strict: each (continued) line is `name==version` and `--hash=sha256:...`
    options only; anything else fails the calling test.
    """
    entries: dict[str, tuple[str, list[str]]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        requirement, *options = line.split()
        name, _, version = requirement.partition("==")
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name), line
        assert re.fullmatch(r"[A-Za-z0-9.+!]+", version), line  # exact: no ranges, no wildcards
        hashes = [HASH_OPTION.fullmatch(option) for option in options]
        assert all(hashes), f"not a sha256 hash option in: {line}"
        assert canonical(name) not in entries, f"{name} twice"
        entries[canonical(name)] = (version, [h.group(1) for h in hashes if h])
    return entries


def pins() -> dict[str, str]:
    return {name: version for name, (version, _) in lock_entries(LOCK.read_text()).items()}


def test_the_package_ships_exactly_the_pinned_versions(package: Path) -> None:
    shipped = shipped_distributions(package)
    assert (
        shipped.pop("memchat")
        == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    )
    assert shipped == pins()
    # The X-Ray SDK is in it (EnableTracing needs no other build); botocore is
    # the runtime's, as boto3 is, not shadowed by a copy of its own.
    assert "aws-xray-sdk" in shipped
    assert "botocore" not in shipped and "boto3" not in shipped


def test_the_cli_extra_stays_out_of_the_lambda_package() -> None:
    """`memchat login`'s `supabase` (the `cli` extra) is the terminal's, never
    the Lambda package's: the lock is exactly memchat[stream,mcp]'s."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert [r.split(">")[0] for r in extras["cli"]] == ["supabase"]
    assert "cli" not in " ".join(extras["stream"])
    supabase_parts = {"supabase", "supabase-auth", "postgrest", "realtime", "storage3"}
    assert supabase_parts & set(pins()) == set()
    assert "[cli" not in BUILD_SCRIPT.read_text() and ",cli" not in BUILD_SCRIPT.read_text()


def test_the_lock_ships_the_mcp_extra() -> None:
    """POST /mcp needs the MCP SDK where ChatFunction runs: the build installs
    memchat[stream,mcp] and the lock pins the SDK."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert [r.split(">")[0] for r in extras["mcp"]] == ["mcp"]
    assert re.search(r'^EXTRAS="stream,mcp"$', BUILD_SCRIPT.read_text(), re.M)
    assert "mcp" in pins()


def test_pyproject_keeps_ranges() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *project["optional-dependencies"]["stream"]]
    assert not [r for r in requirements if "==" in r], requirements
    assert sys.version_info >= (3, 11)


def test_the_build_needs_no_gnu_only_tools() -> None:
    """Linux, macOS and WSL alike: sizes, hashes and the zip are done in Python."""
    script = BUILD_SCRIPT.read_text()
    commands = "\n".join(
        line for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")
    )
    for gnu_only in (
        r"\bdu\s+-\w*b",  # du -b / -sb: GNU
        r"\bstat\s+-c",  # BSD stat has -f
        r"\bfind\b.*-printf",
        r"\breadlink\s+-f",
        r"\bsed\s+-i",
        r"\b(cp|mv)\s+-\w*T",
        r"\bsha256sum\b",
        r"\bzip\s+-",  # not installed everywhere; the zip is made in Python
    ):
        assert not re.search(gnu_only, commands), gnu_only
