"""What a large invalid history import costs everyone else, and what a throttled one costs.

Run on demand (pytest does not collect `bench_*.py`):

    python tests/bench/bench_import_guard.py [--imports 3] [--mb 25] [--rounds 3]

The app runs under uvicorn on 127.0.0.1 in a process of its own, as `memchat
dev` runs it (logged in as memchat_api, one event loop), against the
embedded PostgreSQL (or DATABASE_URL, a disposable one); this process is
the client.

1. The server stays responsive. `--imports` users each POST a body of about
   `--mb` MB to /sessions/import at once (sessions of 100 messages; the very
   last message's `created_at` is "bad", so every byte is parsed and
   validated before the 422), while another task sends GET /health every
   20 ms and times each answer. Reported: the slowest and the median
   /health during the imports (target: the slowest < 500 ms), and how long
   the imports took. `--rounds` repeats it.

2. A throttled import is refused early. A user whose `import` bucket is
   empty sends the same body again and again: the time from sending the
   request to its 429 arriving (target: < 50 ms), for the big body and for
   a small one. The server answers before it reads the body, and closes the
   connection rather than read the rest, so the client's upload stops early.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx
import psycopg

from memchat import devdb, devtokens
from tests.bench import _common as common
from tests.utils.processes import free_port

HEALTH_EVERY_S = 0.02
HEALTH_TARGET_MS = 500.0
REFUSE_TARGET_MS = 50.0
_SPAWN = multiprocessing.get_context("spawn")


def _app_process(database_url: str, model_url: str, port: int) -> None:
    import uvicorn

    from memchat import bootstrap
    from memchat.config import load_settings

    settings = load_settings(
        database_url=database_url,
        supabase_jwt_secret=common.JWT_SECRET,
        openai_api_key="bench-key",
        openai_base_url=model_url,
        db_max_connections=4,
        # Three imports at once, then the throttled user's burst of one.
        import_rate_per_minute=0.01,
        import_rate_burst=1,
    )
    app = bootstrap.app(settings)
    uvicorn.run(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning")


@contextmanager
def app_server(database_url: str) -> Iterator[str]:
    port = free_port()
    process = _SPAWN.Process(
        target=_app_process, args=(database_url, "http://127.0.0.1:9/v1", port)
    )
    process.start()
    base = f"http://127.0.0.1:{port}"
    try:
        common.wait_for_health(base, process.is_alive)
        yield base
    finally:
        process.terminate()
        process.join(10)


def common_auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def invalid_body(megabytes: float) -> bytes:
    """A valid-looking import of about `megabytes` MB whose last time is "bad"."""
    message = "word " * 40
    sessions = []
    size = 0
    while size < megabytes * 1_000_000:
        session = {
            "messages": [
                {
                    "role": "user" if i % 2 == 0 else "assistant",
                    "content": f"{len(sessions)}.{i} {message}",
                    "created_at": "2024-05-01T09:30:00Z",
                }
                for i in range(100)
            ]
        }
        size += len(json.dumps(session))
        sessions.append(session)
    sessions[-1]["messages"][-1]["created_at"] = "bad"
    return json.dumps({"sessions": sessions}).encode()


async def health_watch(client: httpx.AsyncClient, stop: asyncio.Event) -> list[float]:
    samples: list[float] = []
    while not stop.is_set():
        started = time.perf_counter()
        r = await client.get("/health")
        samples.append((time.perf_counter() - started) * 1000)
        assert r.status_code == 200, r.text
        await asyncio.sleep(HEALTH_EVERY_S)
    return samples


async def responsive(base: str, tokens: list[str], body: bytes) -> tuple[list[float], float]:
    """/health's times while the imports run, and the imports' wall time."""
    headers = {"Content-Type": "application/json"}
    limits = httpx.Limits(max_connections=len(tokens) + 2)
    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits) as client:
        stop = asyncio.Event()
        watcher = asyncio.create_task(health_watch(client, stop))
        await asyncio.sleep(0.2)
        started = time.perf_counter()
        answers = await asyncio.gather(
            *(
                client.post(
                    "/sessions/import",
                    content=body,
                    headers={**headers, "Authorization": f"Bearer {token}"},
                )
                for token in tokens
            )
        )
        took = time.perf_counter() - started
        stop.set()
        samples = await watcher
    assert all(a.status_code == 422 for a in answers), [a.text[:200] for a in answers]
    return samples, took


def refusals(base: str, token: str, body: bytes, n: int) -> list[float]:
    """Times to a 429, each request on a new connection (the server closes it)."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    samples = []
    for _ in range(n):
        with httpx.Client(base_url=base, timeout=60) as client:
            started = time.perf_counter()
            try:
                r = client.post("/sessions/import", content=body, headers=headers)
                status = r.status_code
            except httpx.WriteError:  # closed while still uploading: the 429 came first
                status = 429
            samples.append((time.perf_counter() - started) * 1000)
        assert status == 429, status
    return samples


def throttled_rows(
    base: str, admin: psycopg.Connection[Any], body: bytes, small: bytes, n: int
) -> list[list[str]]:
    """Part 2: a user whose one `import` token is spent sends each body `n` times."""
    throttled = common.create_user(admin)
    token = devtokens.mint(common.JWT_SECRET, throttled.user_id)
    headers = {"Content-Type": "application/json", **common_auth(token)}
    with httpx.Client(base_url=base, timeout=60) as client:  # the one token
        r = client.post("/sessions/import", content=small, headers=headers)
        assert r.status_code == 200, r.text
    rows = []
    for label, payload in ((f"{len(body) / 1e6:.1f} MB", body), ("small", small)):
        samples = refusals(base, token, payload, n)
        stats = common.summarize(samples)
        rows.append(
            [
                f"throttled import ({label} body): time to its 429",
                f"{stats.median:.1f}",
                f"{max(samples):.1f}",
                f"{len(samples)}",
                "",
            ]
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--imports", type=int, default=3, help="invalid imports at once")
    parser.add_argument("--mb", type=float, default=25.0, help="each import's size in MB")
    parser.add_argument("--rounds", type=int, default=3, help="times to run part 1")
    parser.add_argument(
        "--refusals", type=int, default=30, help="throttled requests timed (0: part 1 only)"
    )
    args = parser.parse_args()

    load_at_start = common.load_average()
    body = invalid_body(args.mb)
    small = json.dumps({"sessions": [{"messages": []}]}).encode()
    rows: list[list[str]] = []
    with common.database() as target, common.admin_connection(target.url) as admin:
        api_url = devdb.role_conninfo(target.url, devdb.API_ROLE) if target.embedded else target.url
        with app_server(api_url) as base:
            for round_number in range(args.rounds):
                users = [common.create_user(admin) for _ in range(args.imports)]
                tokens = [devtokens.mint(common.JWT_SECRET, u.user_id) for u in users]
                samples, took = asyncio.run(responsive(base, tokens, body))
                stats = common.summarize(samples)
                rows.append(
                    [
                        f"round {round_number + 1}: GET /health during {args.imports} imports",
                        f"{stats.median:.1f}",
                        f"{max(samples):.1f}",
                        f"{len(samples)}",
                        f"{took:.2f} s",
                    ]
                )
            if args.refusals:
                rows += throttled_rows(base, admin, body, small, args.refusals)
        machine = common.machine_report(admin, target, load_at_start=load_at_start)
    print(machine)
    print(
        f"\n{args.imports} imports of {len(body) / 1e6:.1f} MB each at once (invalid: the last"
        f" message's created_at), GET /health every {HEALTH_EVERY_S * 1000:.0f} ms meanwhile"
        f" (target: slowest < {HEALTH_TARGET_MS:.0f} ms); then a throttled user's imports"
        f" (target: < {REFUSE_TARGET_MS:.0f} ms).\n"
    )
    print(common.format_table(["case", "median ms", "max ms", "n", "imports took"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
