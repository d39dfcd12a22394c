"""Cold import time of each Lambda handler module (the init phase's Python part).

Each run is a fresh interpreter that imports one handler module, which does
everything a cold start does before the first request: imports, secrets
(plain environment here), settings, the FastAPI app, the mangum adapter. No
database connection or model call happens at import. Byte-code is never
written (Lambda's package directory is read-only), so a package without
.pyc files pays for compiling on every cold start; by default the modules
come from this checkout, and `--target` points at a built package instead.

    python tests/bench/bench_import.py                      # this checkout, this Python
    bash infra/build_lambda.sh --arch x86_64 --out build/lambda-x86_64 --no-zip
    python tests/bench/bench_import.py --python python3.12 --target build/lambda-x86_64

Prints, per handler: the median and best wall-clock import time over
`--runs` interpreters, `-X importtime`'s cumulative figure, and the median
CPU time the import costs (the interpreter's own start-up subtracted; the
steadiest figure on a busy machine); then the heaviest imports of the chat
handler.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: find `tests`

from tests.bench import _common as common

HANDLERS = [
    "memchat.handlers.chat",
    "memchat.handlers.clear",
    "memchat.handlers.stream",  # module only: the app is built in main()
    "memchat.handlers.cleanup",
]
TARGET_MS = 300.0
ENVIRONMENT = {
    # Shaped like production; nothing connects at import.
    "DATABASE_URL": "postgresql://postgres.ref:pw@127.0.0.1:6543/postgres?sslmode=disable",
    "SUPABASE_JWT_SECRET": "bench-jwt-secret-with-at-least-32-characters",
    "OPENAI_API_KEY": "sk-bench",
    "POWERTOOLS_SERVICE_NAME": "memchat",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "AWS_LAMBDA_FUNCTION_NAME": "memchat-bench",
    "AWS_REGION": "eu-west-1",
    "PYTHONDONTWRITEBYTECODE": "1",
}
_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="interpreter to time")
    parser.add_argument("--target", type=Path, help="a built package directory (PYTHONPATH)")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    env = _environment(args.target)
    version = subprocess.run(
        [args.python, "-c", "import platform; print(platform.python_version())"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    has_botocore = (
        subprocess.run(
            [args.python, "-c", "import botocore"], env=env, capture_output=True
        ).returncode
        == 0
    )

    baseline = statistics.median(cpu_ms(args.python, "pass", env) for _ in range(args.runs))
    rows = []
    for module in HANDLERS:
        walls = [wall_ms(args.python, module, env) for _ in range(args.runs)]
        cpu = statistics.median(
            cpu_ms(args.python, f"import {module}", env) - baseline for _ in range(args.runs)
        )
        cumulative = [
            next(t for _, t, _, name in importtime(args.python, module, env) if name == module)
            / 1000
            for _ in range(max(3, args.runs // 2))
        ]
        median = statistics.median(walls)
        rows.append(
            [
                module,
                f"{median:.0f}",
                f"{min(walls):.0f}",
                f"{statistics.median(cumulative):.0f}",
                f"{cpu:.0f}",
                "yes" if min(median, cpu) <= TARGET_MS else "no",
            ]
        )

    source = str(args.target) if args.target else "this checkout (functions/)"
    print(f"Python {version} ({args.python}); modules from {source}; runs: {args.runs}")
    print(f"botocore importable (Powertools imports it, as in Lambda): {has_botocore}")
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs\n")
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
            rows,
        )
    )

    chat = importtime(args.python, HANDLERS[0], env)
    top = sorted((r for r in chat if r[2] <= 2), key=lambda r: -r[1])[:12]
    print("\nheaviest imports under memchat.handlers.chat (cumulative ms, one run):\n")
    print(
        common.format_table(
            ["module", "cumulative ms", "depth"],
            [[name, f"{total / 1000:.0f}", str(depth)] for _, total, depth, name in top],
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
