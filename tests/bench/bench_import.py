"""Cold start of each Lambda handler: the import (the init phase's Python part), the first request.

Each run is a fresh interpreter that imports one handler module, which does
everything a cold start does before the first request: imports, secrets
(plain environment here), settings, the FastAPI app with the function's
ROUTE_GROUPS (as template.yaml sets them), the mangum adapter (and the chat
function's check of the embedding column: here a refused connection, as
DATABASE_URL points at no server). Byte-code is never written
(Lambda's package directory is read-only), so modules without a valid .pyc
are compiled on every cold start. Where the modules come from:

- this checkout's functions/ (the default): memchat's own modules have no
  .pyc here, so they are compiled in every run; the dependencies come from
  the interpreter's site-packages;
- `--package`: this checkout, and also the Lambda package as deployed:
  `infra/build_lambda.sh --arch <this machine> --out TMP --no-zip`, zipped
  the way `sam deploy` zips it (every entry dated 1980-01-01), and unpacked
  the way Lambda unpacks it (each file dated as its zip entry, nothing
  written), imported by a Python of the package's version (python3.12, or
  pyenv's: `--python` to choose);
- `--zip FILE`: that zip (e.g. build/memchat-lambda.zip), unpacked the same way;
- `--target DIR`: a package directory as it is.

For a package it also says which byte-code it holds and how much of it is
stale (timestamp-checked .pyc files whose source's date no longer matches,
so every cold start compiles those modules again).

`--first-request` also times, against the embedded PostgreSQL (pgserver, a
temporary directory) and the tests' fake model (loopback, answers at once),
a chat turn through the chat handler as Lambda invokes it, in a fresh
interpreter: the import, then the first request (what a cold start costs
without SnapStart: the request pays for what the import left to first use);
and the same first request after the SnapStart hooks ran (before-snapshot,
after-restore: what a restored instance's first request costs, the restore
itself aside).

    python tests/bench/bench_import.py                          # this checkout
    python tests/bench/bench_import.py --package --first-request
    python tests/bench/bench_import.py --zip build/memchat-lambda.zip
    bash infra/build_lambda.sh --arch x86_64 --out build/lambda-x86_64 --no-zip
    python tests/bench/bench_import.py --target build/lambda-x86_64

Prints, per source and handler: the median and best wall-clock import time
over `--runs` interpreters, `-X importtime`'s cumulative figure, and the
median CPU time the import costs (the interpreter's own start-up subtracted;
the steadiest figure on a busy machine); a last row times the stack alone
(FastAPI, mangum, psycopg, Powertools: what any handler on it imports before
a line of memchat runs); then the heaviest imports of the chat handler.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: find `tests`

from tests.bench import _common as common

HANDLERS = [
    "memchat.handlers.chat",
    "memchat.handlers.clear",
    "memchat.handlers.stream",  # module only: the app is built in main()
    "memchat.handlers.cleanup",
]
# Each function's ROUTE_GROUPS, as template.yaml deploys it (the app only has those routes).
ROUTE_GROUPS = {
    "memchat.handlers.chat": "chat",
    "memchat.handlers.clear": "sessions",
}
TARGET_MS = 300.0
# What the chat handler cannot do without, imported alone: the web framework,
# the Lambda adapter, the database driver and Powertools' logger and metrics.
# Its time is the floor under any handler built on this stack.
STACK = (
    "fastapi",
    "mangum",
    "psycopg",
    "aws_lambda_powertools.logging",
    "aws_lambda_powertools.metrics",
)
STACK_ROW = "(the stack alone: " + ", ".join(STACK) + ")"
ENVIRONMENT = {
    # Shaped like production; nothing answers at this DATABASE_URL.
    "DATABASE_URL": "postgresql://postgres.ref:pw@127.0.0.1:6543/postgres?sslmode=disable",
    "SUPABASE_JWT_SECRET": common.JWT_SECRET,
    "OPENAI_API_KEY": "sk-bench",
    "POWERTOOLS_SERVICE_NAME": "memchat",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "AWS_LAMBDA_FUNCTION_NAME": "memchat-bench",
    "AWS_REGION": "eu-west-1",
    "PYTHONDONTWRITEBYTECODE": "1",
}
SAM_DATE = (1980, 1, 1, 0, 0, 0)  # what `sam deploy`'s zips date every entry
_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")
_EXTENSION = re.compile(r"\.cpython-3(\d+)-")
# A .pyc's flags (PEP 552): bit 0, hash-based; bit 1, check the source's hash.
_PYC_FLAGS = {0: "timestamp", 1: "unchecked-hash", 3: "checked-hash"}


def _environment(target: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_SECRET_ARN", "_PARAMETER"))}
    env.update(ENVIRONMENT)
    if target is not None:
        env["PYTHONPATH"] = str(target)
    else:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(common.REPO_ROOT / "functions"), env.get("PYTHONPATH", "")]
        ).rstrip(os.pathsep)
    return env


def wall_ms(python: str, module: str, env: dict[str, str]) -> float:
    code = (
        "import time; t = time.perf_counter(); "
        f"import {module}; print((time.perf_counter() - t) * 1000)"
    )
    out = subprocess.run(
        [python, "-c", code], env=env, check=True, capture_output=True, text=True
    ).stdout
    return float(out.strip().splitlines()[-1])


def cpu_ms(python: str, code: str, env: dict[str, str]) -> float:
    """CPU time (user + system) of a fresh interpreter running `code`.

    Less disturbed than wall-clock time when other work shares the machine.
    The interpreter exits with os._exit, so its clean-up is not counted.
    """
    code = f"{code}; import os; os._exit(0)"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([python, "-c", code], env=env, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1000


def importtime(python: str, module: str, env: dict[str, str]) -> list[tuple[int, int, int, str]]:
    """(self µs, cumulative µs, depth, name) for each module imported."""
    err = subprocess.run(
        [python, "-X", "importtime", "-c", f"import {module}"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stderr
    rows = []
    for line in err.splitlines():
        match = _LINE.match(line)
        if match:
            own, total, indent, name = match.groups()
            rows.append((int(own), int(total), len(indent) // 2, name))
    return rows


# ------------------------------------------------------------- the package


def sam_zip(directory: Path, zip_path: Path) -> None:
    """Zip a build directory the way `sam deploy` does: every entry dated 1980-01-01."""
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                info = zipfile.ZipInfo(path.relative_to(directory).as_posix(), SAM_DATE)
                info.external_attr = (0o100000 | (path.stat().st_mode & 0o777)) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, path.read_bytes())


def lambda_unpack(zip_path: Path, directory: Path) -> None:
    """Unpack a code zip as Lambda does: each file dated as its entry, modes kept."""
    with zipfile.ZipFile(zip_path) as archive:
        for info in archive.infolist():
            path = Path(archive.extract(info, directory))
            if info.is_dir():
                continue
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                path.chmod(mode)
            stamp = time.mktime((*info.date_time, 0, 0, -1))
            os.utime(path, (stamp, stamp))


def build_package(work: Path) -> Path:
    """infra/build_lambda.sh for this machine, SAM-zipped, unpacked as Lambda does."""
    arch = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}[
        platform.machine().lower()
    ]
    build = work / "build"
    started = time.perf_counter()
    subprocess.run(
        [
            "bash",
            str(common.REPO_ROOT / "infra" / "build_lambda.sh"),
            *("--arch", arch, "--out", str(build), "--no-zip"),
        ],
        check=True,
    )
    print(f"built in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    zip_path = work / "sam.zip"
    sam_zip(build, zip_path)
    shutil.rmtree(build)
    return unpack(zip_path, work)


def unpack(zip_path: Path, work: Path) -> Path:
    task = work / "task"  # Lambda's /var/task
    lambda_unpack(zip_path, task)
    return task


def package_version(target: Path) -> str | None:
    """The Python version the package's compiled extensions are built for ("3.12")."""
    for path in target.rglob("*.so"):
        match = _EXTENSION.search(path.name)
        if match:
            return f"3.{match.group(1)}"
    return None


def python_for(version: str | None, requested: str | None) -> str:
    """The interpreter to import a package with: --python, or one of its version."""
    if requested:
        return requested
    if version is None:
        return sys.executable
    found = shutil.which(f"python{version}")
    if found and subprocess.run([found, "-V"], capture_output=True).returncode == 0:
        return found
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        prefix = subprocess.run(
            ["pyenv", "prefix", version], check=True, capture_output=True, text=True
        ).stdout.strip()
        candidate = Path(prefix) / "bin" / f"python{version}"
        if candidate.exists():
            return str(candidate)
    raise SystemExit(f"no python{version} for the package: give one with --python")


def bytecode(target: Path) -> str:
    """What kind of .pyc the package holds, and how many are stale for their source."""
    kinds: Counter[str] = Counter()
    stale = 0
    for pyc in target.rglob("__pycache__/*.pyc"):
        with pyc.open("rb") as f:
            header = f.read(16)
        flags = int.from_bytes(header[4:8], "little")
        kinds[_PYC_FLAGS.get(flags, "other")] += 1
        if flags == 0:
            source = pyc.parent.parent / (pyc.name.split(".", 1)[0] + ".py")
            if source.exists():
                stat = source.stat()
                recorded = int.from_bytes(header[8:12], "little")
                size = int.from_bytes(header[12:16], "little")
                if recorded != int(stat.st_mtime) & 0xFFFFFFFF or size != stat.st_size & 0xFFFFFFFF:
                    stale += 1
    if not kinds:
        return "no .pyc files (every cold start compiles every module)"
    held = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
    return f"{held}; stale (timestamp not matching the source): {stale}"


# ------------------------------------------------------------- import timing


def function_env(env: dict[str, str], module: str) -> dict[str, str]:
    """`env` as the function that runs `module` has it (its ROUTE_GROUPS)."""
    env = {k: v for k, v in env.items() if k != "ROUTE_GROUPS"}
    if module in ROUTE_GROUPS:
        env["ROUTE_GROUPS"] = ROUTE_GROUPS[module]
    return env


def time_imports(python: str, common_env: dict[str, str], runs: int) -> list[list[str]]:
    baseline = statistics.median(cpu_ms(python, "pass", common_env) for _ in range(runs))

    def row(label: str, modules: str, env: dict[str, str], cumulative: str) -> list[str]:
        walls = [wall_ms(python, modules, env) for _ in range(runs)]
        cpu = statistics.median(
            cpu_ms(python, f"import {modules}", env) - baseline for _ in range(runs)
        )
        median = statistics.median(walls)
        return [
            label,
            f"{median:.0f}",
            f"{min(walls):.0f}",
            cumulative,
            f"{cpu:.0f}",
            "yes" if min(median, cpu) <= TARGET_MS else "no",
        ]

    rows = []
    for module in HANDLERS:
        env = function_env(common_env, module)
        cumulative = [
            next(t for _, t, _, name in importtime(python, module, env) if name == module) / 1000
            for _ in range(max(3, runs // 2))
        ]
        rows.append(row(module, module, env, f"{statistics.median(cumulative):.0f}"))
    stack_env = function_env(common_env, HANDLERS[0])
    rows.append(row(STACK_ROW, ", ".join(STACK), stack_env, "-"))
    return rows


def heaviest(python: str, env: dict[str, str]) -> list[list[str]]:
    chat = importtime(python, HANDLERS[0], function_env(env, HANDLERS[0]))
    top = sorted((r for r in chat if r[2] <= 2), key=lambda r: -r[1])[:12]
    return [[name, f"{total / 1000:.0f}", str(depth)] for _, total, depth, name in top]


# ------------------------------------------------------------- first request

# Run by the interpreter under test: import, [SnapStart hooks], first request.
FIRST_REQUEST = r"""
import json, sys, time
started = time.perf_counter()
import memchat.handlers.chat as chat
imported = time.perf_counter()
if sys.argv[1] == "snapstart":
    from memchat.handlers import instance
    instance.run_before_snapshot()
    instance.run_after_restore()


class Context:
    function_name = "memchat-bench-ChatFunction"
    function_version = "1"
    memory_limit_in_mb = 1024
    invoked_function_arn = "arn:aws:lambda:eu-west-1:123456789012:function:memchat-bench"
    aws_request_id = "00000000-0000-0000-0000-000000000000"
    log_group_name = log_stream_name = "bench"

    def get_remaining_time_in_millis(self):
        return 29000


event = json.loads(sys.stdin.read())
before = time.perf_counter()
response = chat.handler(event, Context())
done = time.perf_counter()
print(json.dumps({
    "import_ms": (imported - started) * 1000,
    "request_ms": (done - before) * 1000,
    "status": response["statusCode"],
}))
"""


@dataclass
class FirstRequest:
    import_ms: float
    request_ms: float


def first_request(
    python: str, env: dict[str, str], event: dict[str, object], mode: str
) -> FirstRequest | None:
    """One fresh interpreter: the chat handler's import and first request (None:
    this code has no SnapStart hooks)."""
    body = copy.deepcopy(event)
    body["body"] = json.dumps({"message": "Hi, I'm Ada.", "session_id": str(uuid.uuid4())})
    done = subprocess.run(
        [python, "-c", FIRST_REQUEST, mode],
        env=env,
        input=json.dumps(body),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        if mode == "snapstart" and "run_before_snapshot" in done.stderr:
            return None
        raise RuntimeError(f"first request failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["status"] != 200:
        raise RuntimeError(f"first request answered {result['status']}")
    return FirstRequest(result["import_ms"], result["request_ms"])


@contextlib.contextmanager
def chat_backend() -> Iterator[tuple[dict[str, str], dict[str, object]]]:
    """The embedded PostgreSQL and the fake model: the chat function's variables
    and a chat event with a user's token."""
    from memchat import devdb, devtokens
    from tests.utils.fake_openai import FakeOpenAI

    secret = ENVIRONMENT["SUPABASE_JWT_SECRET"]
    with common.database() as target:
        admin = common.admin_connection(target.url)
        caller = common.create_user(admin)
        model = FakeOpenAI()
        try:
            variables = {
                "DATABASE_URL": devdb.role_conninfo(target.url, devdb.API_ROLE),
                "OPENAI_BASE_URL": model.url,
                "OPENAI_MODEL": "gpt-4o-mini",  # a real tokenizer, as deployed
                "ROUTE_GROUPS": "chat",
                "CHAT_RATE_PER_MINUTE": "0",  # many first turns from one user
            }
            event = json.loads((common.REPO_ROOT / "tests" / "events" / "chat.json").read_text())
            event["headers"]["authorization"] = f"Bearer {devtokens.mint(secret, caller.user_id)}"
            del event["headers"]["content-length"]
            yield variables, event
        finally:
            model.close()
            admin.close()


def time_first_requests(
    sources: list[tuple[str, str, dict[str, str]]], runs: int
) -> list[list[str]]:
    rows = []
    with chat_backend() as (variables, event):
        for label, python, env in sources:
            env = {**env, **variables}
            cold = [first_request(python, env, event, "cold") for _ in range(runs)]
            restored = [first_request(python, env, event, "snapstart") for _ in range(runs)]
            imports = statistics.median(r.import_ms for r in cold if r)
            requests = statistics.median(r.request_ms for r in cold if r)
            totals = statistics.median(r.import_ms + r.request_ms for r in cold if r)
            after = [r.request_ms for r in restored if r]
            rows.append(
                [
                    label,
                    f"{imports:.0f}",
                    f"{requests:.0f}",
                    f"{totals:.0f}",
                    f"{statistics.median(after):.0f}" if after else "(no hooks)",
                ]
            )
    return rows


# ------------------------------------------------------------------ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", help="interpreter to import a package with")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--target", type=Path, help="a built package directory (PYTHONPATH)")
    where.add_argument("--zip", type=Path, help="a code zip, unpacked as Lambda does")
    where.add_argument(
        "--package", action="store_true", help="also build the package and time it as deployed"
    )
    parser.add_argument("--first-request", action="store_true", help="also time a first request")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="memchat-bench-import-") as tmp:
        work = Path(tmp)
        sources: list[tuple[str, str, dict[str, str]]] = []
        notes = []
        if args.target is None and args.zip is None:
            checkout = args.python if args.python and not args.package else sys.executable
            sources.append(("this checkout (functions/)", checkout, _environment(None)))
        package: Path | None = None
        if args.package:
            package = build_package(work)
            label = "the package (SAM-style zip, unpacked as Lambda does)"
        elif args.zip is not None:
            package = unpack(args.zip, work)
            label = f"{args.zip} (unpacked as Lambda does)"
        elif args.target is not None:
            package = args.target
            label = str(args.target)
        if package is not None:
            python = python_for(package_version(package), args.python)
            sources.append((label, python, _environment(package)))
            notes.append(f"byte-code in {label}: {bytecode(package)}")

        print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs")
        print(f"load average at start: {common.load_average()}; runs: {args.runs}")
        print(f"command: {common.command_line()}")
        for note in notes:
            print(note)
        for label, python, env in sources:
            version = subprocess.run(
                [python, "-c", "import platform; print(platform.python_version())"],
                capture_output=True,
                text=True,
            ).stdout.strip()
            has_botocore = (
                subprocess.run([python, "-c", "import botocore"], env=env, capture_output=True)
            ).returncode == 0
            print(f"\nImport, modules from {label}: Python {version} ({python})")
            print(f"botocore importable (Powertools imports it, as in Lambda): {has_botocore}\n")
            print(
                common.format_table(
                    [
                        "handler module",
                        "median ms",
                        "best ms",
                        "-X importtime ms",
                        "CPU ms",
                        f"<= {TARGET_MS:.0f}",
                    ],
                    time_imports(python, env, args.runs),
                )
            )
            print("\nheaviest imports under memchat.handlers.chat (cumulative ms, one run):\n")
            print(common.format_table(["module", "cumulative ms", "depth"], heaviest(python, env)))

        if args.first_request:
            print(
                "\nThe chat handler's first request (a chat turn, embedded PostgreSQL, fake"
                " model), wall ms, median of fresh interpreters:\n"
            )
            print(
                common.format_table(
                    [
                        "modules from",
                        "import",
                        "first request",
                        "import + first request",
                        "first request after the SnapStart hooks",
                    ],
                    time_first_requests(sources, args.runs),
                )
            )
        print(f"\nload average at end: {common.load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
