"""Cold start of each Lambda handler: the import (the init phase's Python part), the first request.

Each run is a fresh interpreter that imports one handler module, which does
everything a cold start does before the first request: imports, secrets
(plain environment here), settings, the FastAPI app with the function's
ROUTE_GROUPS (as template.yaml sets them), the mangum adapter (and the chat
function's check of the embedding column: here a refused connection, as
DATABASE_URL points at no server). Where the modules come from:

- this checkout's functions/ (the default; the editable install): every
  module's byte-code is read from (and, by an untimed first import, written
  to) a private cache in a temporary directory (PYTHONPYCACHEPREFIX), as in a
  developer's environment after its first run: nothing is compiled in a
  timed run, as nothing is in the package;
- `--package`: this checkout, and also the Lambda package as deployed:
  `infra/build_lambda.sh --arch <this machine> --out TMP --no-zip` (the
  script `sam build` runs, for this machine's architecture), zipped the way
  `sam deploy` zips it (every entry dated 1980-01-01), and unpacked the way
  Lambda unpacks it (each file dated as its zip entry), imported by a Python
  of the package's version (python3.12, or pyenv's: `--python` to choose)
  with byte-code writing off (PYTHONDONTWRITEBYTECODE: Lambda's package
  directory is read-only, so a module without a valid .pyc is compiled on
  every cold start);
- `--zip FILE`: that zip (e.g. build/memchat-lambda.zip), unpacked the same way;
- `--target DIR`: a package directory as it is.

For a package it also says which byte-code it holds and how much of it is
stale (timestamp-checked .pyc files whose source's date no longer matches,
so every cold start compiles those modules again).

The figure that is kept: the
chat handler's import against the import of the stack it stands on, whole
processes, paired. `python -c 'import memchat.handlers.chat'` and `python -c
'import fastapi, mangum, psycopg, aws_lambda_powertools.logging,
aws_lambda_powertools.metrics'`, in the same environment (the chat
function's), run alternately (handler first in one pair, the stack first in
the next), each timed from the parent's spawn to the child's exit right
after its import (os._exit): the interpreter's start-up included, its exit
(a full garbage collection, which Lambda never runs) not:
the handler's init freezes its heap (gc.freeze), so its exit's collection
skips what the stack's walks, and a ratio with the exits would flatter the
handler (`--with-exit` prints that one too). The median of the pairs'
ratios must stay <= 1.25 (RATIO_LIMIT; wall-clock time; the CPU time's
ratio is printed beside it). tests/bench/test_import_smoke.py keeps it so.

`--first-request` also times, against the embedded PostgreSQL (pgserver, a
temporary directory) and the tests' fake model (loopback, answers at once),
a chat turn through the chat handler as Lambda invokes it, in a fresh
interpreter: the import, then the first request (what a cold start costs
without SnapStart: the request pays for what the import left to first use),
then a second one (a warm instance's request); and, in another fresh
interpreter, the same first request after the SnapStart hooks ran in it
(before-snapshot, after-restore: what a restored instance's first request
costs, the restore itself aside; the process's memory is warm here, while a
restored microVM pages its snapshot in as it touches it).

    python tests/bench/bench_import.py                          # this checkout
    python tests/bench/bench_import.py --package --first-request
    python tests/bench/bench_import.py --package --pairs 41 --runs 3  # the ratio, mostly
    python tests/bench/bench_import.py --pairs 41 --with-exit   # and with the exit
    python tests/bench/bench_import.py --zip build/memchat-lambda.zip
    bash infra/build_lambda.sh --arch x86_64 --out build/lambda-x86_64 --no-zip
    python tests/bench/bench_import.py --target build/lambda-x86_64

Prints, per source: the paired ratio (handler / stack, `--pairs` pairs);
then, per handler, the median and best wall-clock import time over `--runs`
interpreters, `-X importtime`'s cumulative figure, and the median CPU time
the import costs (the interpreter's own start-up subtracted; the steadiest
figure on a busy machine); a last row times the stack alone (FastAPI,
mangum, psycopg, Powertools: what any handler on it imports before a line
of memchat runs); then the heaviest imports of the chat handler.
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
    "memchat.handlers.stream",  # module only: main() builds the app (memchat.bootstrap)
    "memchat.handlers.cleanup",
]
# Each function's ROUTE_GROUPS, as template.yaml deploys it (the app only has those routes).
ROUTE_GROUPS = {
    "memchat.handlers.chat": "chat",
    "memchat.handlers.clear": "sessions",
}
# The chat handler's import may cost at most this many times the stack's (below):
# the median ratio of paired whole-process runs (`paired_imports`).
RATIO_LIMIT = 1.25
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
HANDLER_IMPORT = f"import {HANDLERS[0]}"
STACK_IMPORT = "import " + ", ".join(STACK)
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


def _environment(target: Path | None, pycache: Path | None = None) -> dict[str, str]:
    """The variables a run gets: ENVIRONMENT, the modules of `target` (a
    package directory; None: this checkout). With `pycache`, byte-code is
    read from and written to that directory (PYTHONPYCACHEPREFIX) instead of
    never written: see `checkout_environment`."""
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_SECRET_ARN", "_PARAMETER"))}
    env.update(ENVIRONMENT)
    if pycache is not None:
        del env["PYTHONDONTWRITEBYTECODE"]
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    if target is not None:
        env["PYTHONPATH"] = str(target)
    else:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(common.REPO_ROOT / "functions"), env.get("PYTHONPATH", "")]
        ).rstrip(os.pathsep)
    return env


def checkout_environment(python: str, pycache: Path) -> dict[str, str]:
    """This checkout's (the editable install's) variables, byte-code cached in
    `pycache` (PYTHONPYCACHEPREFIX; this machine's own PYTHONDONTWRITEBYTECODE
    aside), and the cache filled: every module the chat handler and the stack
    import (the other handlers' too) has its byte-code there, so a timed run
    compiles nothing, as in the package."""
    env = _environment(None, pycache)
    for module in HANDLERS:
        subprocess.run(
            [python, "-c", f"import {module}"],
            env=function_env(env, module),
            check=True,
            capture_output=True,
        )
    return env


def whole_process(python: str, code: str, env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms) of a fresh interpreter running `code`, from the spawn
    to its exit: start-up, `code` and the interpreter's exit, all of it."""
    started = time.perf_counter()
    child = subprocess.Popen(
        [python, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(child.pid, 0)
    wall = (time.perf_counter() - started) * 1000
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        failed = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True)
        raise RuntimeError(f"python -c {code!r} failed:\n{failed.stderr[-3000:]}")
    return wall, (usage.ru_utime + usage.ru_stime) * 1000


@dataclass
class Paired:
    """Paired whole-process runs of the chat handler's import and the stack's."""

    handler: list[tuple[float, float]]  # (wall ms, CPU ms), one per pair
    stack: list[tuple[float, float]]

    def ratios(self, which: int) -> list[float]:
        return [h[which] / s[which] for h, s in zip(self.handler, self.stack, strict=True)]

    @property
    def ratio(self) -> float:
        """The median of the pairs' wall-clock ratios: the figure kept <= RATIO_LIMIT."""
        return statistics.median(self.ratios(0))

    @property
    def cpu_ratio(self) -> float:
        return statistics.median(self.ratios(1))

    def median(self, side: list[tuple[float, float]], which: int) -> float:
        return statistics.median(run[which] for run in side)

    def row(self, label: str) -> list[str]:
        wall = self.ratios(0)
        return [
            label,
            str(len(self.handler)),
            f"{self.median(self.handler, 0):.0f}",
            f"{self.median(self.stack, 0):.0f}",
            f"{self.ratio:.3f}",
            f"{min(wall):.2f}-{max(wall):.2f}",
            f"{self.cpu_ratio:.3f}",
            "yes" if self.ratio <= RATIO_LIMIT else "no",
        ]


PAIRED_HEADERS = [
    "modules from",
    "pairs",
    "handler median ms",
    "stack median ms",
    "ratio (median of pairs)",
    "pairs' range",
    "CPU ratio",
    f"<= {RATIO_LIMIT}",
]


# Appended to both commands by `paired_imports` (unless finalize=True): the process
# ends without the interpreter's finalization (a full garbage collection),
# which Lambda never runs.
NO_EXIT = "; import os; os._exit(0)"


def paired_imports(
    python: str, env: dict[str, str], pairs: int, *, finalize: bool = False
) -> Paired:
    """`import memchat.handlers.chat` against `import <STACK>`, whole processes,
    in the chat function's environment, alternately: the handler first in
    even pairs, the stack first in odd ones (a drift in the machine's speed
    weighs on both sides alike). One untimed run of each first.
    Each process ends with os._exit right after the import (NO_EXIT; the kept
    figure), or with the interpreter's exit when `finalize`."""
    env = function_env(env, HANDLERS[0])
    handler_code, stack_code = HANDLER_IMPORT, STACK_IMPORT
    if not finalize:
        handler_code, stack_code = handler_code + NO_EXIT, stack_code + NO_EXIT
    whole_process(python, handler_code, env)
    whole_process(python, stack_code, env)
    result = Paired([], [])
    for pair in range(pairs):
        if pair % 2:
            stack = whole_process(python, stack_code, env)
            handler = whole_process(python, handler_code, env)
        else:
            handler = whole_process(python, handler_code, env)
            stack = whole_process(python, stack_code, env)
        result.handler.append(handler)
        result.stack.append(stack)
    return result


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
        return [label, f"{median:.0f}", f"{min(walls):.0f}", cumulative, f"{cpu:.0f}"]

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

# Run by the interpreter under test: import, [SnapStart hooks], first request,
# a second request (a warm instance's). stdin: the two events, a JSON list.
FIRST_REQUEST = r"""
import importlib, json, sys, time
started = time.perf_counter()
import memchat.handlers.chat as chat
imported = time.perf_counter()
if sys.argv[1] == "snapstart":
    hooks = None
    # Where the hooks live: memchat.snapstart (issue 21), memchat.handlers.instance before.
    for name in ("memchat.snapstart", "memchat.handlers.instance"):
        try:
            hooks = importlib.import_module(name)
            break
        except ImportError:
            pass
    if not hasattr(hooks, "run_before_snapshot"):
        sys.exit(3)  # this code has no SnapStart hooks
    hooks.run_before_snapshot()
    hooks.run_after_restore()


class Context:
    function_name = "memchat-bench-ChatFunction"
    function_version = "1"
    memory_limit_in_mb = 1024
    invoked_function_arn = "arn:aws:lambda:eu-west-1:123456789012:function:memchat-bench"
    aws_request_id = "00000000-0000-0000-0000-000000000000"
    log_group_name = log_stream_name = "bench"

    def get_remaining_time_in_millis(self):
        return 29000


times, statuses = [], []
for event in json.loads(sys.stdin.read()):
    before = time.perf_counter()
    response = chat.handler(event, Context())
    times.append((time.perf_counter() - before) * 1000)
    statuses.append(response["statusCode"])
print(json.dumps({
    "import_ms": (imported - started) * 1000,
    "request_ms": times[0],
    "warm_ms": times[1],
    "statuses": statuses,
}))
"""


@dataclass
class FirstRequest:
    import_ms: float
    request_ms: float  # the first request
    warm_ms: float  # the second, in the same process


def first_request(
    python: str, env: dict[str, str], event: dict[str, object], mode: str
) -> FirstRequest | None:
    """One fresh interpreter: the chat handler's import, its first request and
    a second one, each a first turn of a new session (None: this code has no
    SnapStart hooks)."""
    events = []
    for message in ("Hi, I'm Ada.", "Hi again, it's Ada."):
        body = copy.deepcopy(event)
        body["body"] = json.dumps({"message": message, "session_id": str(uuid.uuid4())})
        events.append(body)
    done = subprocess.run(
        [python, "-c", FIRST_REQUEST, mode],
        env=env,
        input=json.dumps(events),
        capture_output=True,
        text=True,
    )
    if mode == "snapstart" and done.returncode == 3:
        return None
    if done.returncode != 0:
        raise RuntimeError(f"first request failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["statuses"] != [200, 200]:
        raise RuntimeError(f"the requests answered {result['statuses']}")
    return FirstRequest(result["import_ms"], result["request_ms"], result["warm_ms"])


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
            cold = [
                r for r in (first_request(python, env, event, "cold") for _ in range(runs)) if r
            ]
            restored = [
                r
                for r in (first_request(python, env, event, "snapstart") for _ in range(runs))
                if r
            ]
            rows.append(
                [
                    label,
                    f"{statistics.median(r.import_ms for r in cold):.0f}",
                    f"{statistics.median(r.request_ms for r in cold):.0f}",
                    f"{statistics.median(r.import_ms + r.request_ms for r in cold):.0f}",
                    f"{statistics.median(r.request_ms for r in restored):.0f}"
                    if restored
                    else "(no hooks)",
                    f"{statistics.median(r.warm_ms for r in cold):.1f}",
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
    parser.add_argument("--runs", type=int, default=7, help="interpreters per handler row")
    parser.add_argument("--pairs", type=int, default=31, help="paired runs for the ratio")
    parser.add_argument(
        "--with-exit",
        action="store_true",
        help="also the ratio with the interpreter's exit (whole processes to their end)",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="memchat-bench-import-") as tmp:
        work = Path(tmp)
        sources: list[tuple[str, str, dict[str, str]]] = []
        notes = []
        if args.target is None and args.zip is None:
            checkout = args.python if args.python and not args.package else sys.executable
            env = checkout_environment(checkout, work / "pycache")
            sources.append(("this checkout (functions/, editable install)", checkout, env))
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
        versions: dict[str, str] = {}
        for label, python, _ in sources:
            versions[label] = subprocess.run(
                [python, "-c", "import platform; print(platform.python_version())"],
                capture_output=True,
                text=True,
            ).stdout.strip()

        print(
            f"\n`{HANDLER_IMPORT}` against `{STACK_IMPORT}`: whole processes (spawn to os._exit),"
            f" {args.pairs} alternating pairs, ROUTE_GROUPS=chat; ratio = handler / stack,"
            " wall clock (CPU time's beside it):\n"
        )
        rows = []
        for label, python, env in sources:
            paired = paired_imports(python, env, args.pairs)
            rows.append(paired.row(f"{label}, Python {versions[label]}"))
            if args.with_exit:
                paired = paired_imports(python, env, args.pairs, finalize=True)
                rows.append(paired.row(f"{label}, Python {versions[label]}, with the exit"))
        print(common.format_table(PAIRED_HEADERS, rows))

        for label, python, env in sources:
            has_botocore = (
                subprocess.run([python, "-c", "import botocore"], env=env, capture_output=True)
            ).returncode == 0
            print(f"\nImport, modules from {label}: Python {versions[label]} ({python})")
            print(f"botocore importable (Powertools imports it, as in Lambda): {has_botocore}\n")
            print(
                common.format_table(
                    ["handler module", "median ms", "best ms", "-X importtime ms", "CPU ms"],
                    time_imports(python, env, args.runs),
                )
            )
            print("\nheaviest imports under memchat.handlers.chat (cumulative ms, one run):\n")
            print(common.format_table(["module", "cumulative ms", "depth"], heaviest(python, env)))

        if args.first_request:
            print(
                "\nThe chat handler's first request (a chat turn of a new session, embedded"
                " PostgreSQL, fake model), wall ms, median of fresh interpreters:\n"
            )
            print(
                common.format_table(
                    [
                        "modules from",
                        "import",
                        "first request",
                        "import + first request",
                        "first request after the SnapStart hooks",
                        "a warm instance's request (the second)",
                    ],
                    time_first_requests(sources, args.runs),
                )
            )
        print(f"\nload average at end: {common.load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
