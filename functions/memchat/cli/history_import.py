"""`memchat import FILE`: conversations from a file into an account, through the API.

The file is memchat's own export (GET /export or GET /chat/export/{id}, JSON
or NDJSON) or the plain shape (docs/api.md, "History import"). It is checked
whole before anything is sent (every malformed record named), then sent in
requests the server takes (its GET /sessions/import/status says how large),
each a whole number of sessions. A throttled request (429) waits its
Retry-After and goes on; a failed one is retried a few times. The server
skips the sessions it has already, so running the same command again after
a failure imports only what is missing.

Then, unless --no-wait, it waits until recall sees what was imported (no
message waits for an embedding) or --timeout passes: exit code 0 when done,
1 on a failure, 3 when the wait timed out (everything imported; recall
finds the rest once the backfill has embedded it), 4 when the backfill gave
up on some of the account's messages (their embeddings failed again and
again: recall cannot find them until they are imported again). A progress
bar on a terminal, plain lines otherwise.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from memchat.cli.base import Handled, add_described_command, err

if TYPE_CHECKING:
    import argparse

    from memchat.cli.base import Subcommands

DEFAULT_URL = "http://127.0.0.1:8000"
STATUS_PATH = "/sessions/import/status"
IMPORT_PATH = "/sessions/import"
POLL_SECONDS = 2.0
RETRIES = 3  # a request that failed on the server's side or the network's
WAIT_TIMED_OUT = 3  # the exit code: imported, recall not ready yet
EMBEDDINGS_FAILED = 4  # the exit code: imported, some messages' embeddings given up
# What a server that does not say (an older one) takes.
FALLBACK_LIMITS = {
    "max_request_bytes": 1_000_000,
    "max_sessions_per_request": 1000,
    "max_messages_per_session": 10_000,
}


def cmd_import(args: argparse.Namespace) -> int:
    import httpx2 as httpx  # ships with the openai SDK (>= 3)

    document = read_file(Path(args.file))
    sessions, notes = sessions_of(document)
    memories = durable_memories(document, sessions)
    if not sessions and not notes and not memories:
        err(f"! {args.file} holds nothing to import: no sessions and no notes")
        return 1
    headers = {"Authorization": f"Bearer {_token(args)}"}
    with httpx.Client(base_url=args.url, headers=headers, timeout=300) as client:
        try:
            limits = _limits(client)
            if args.max_request_bytes:
                limits["max_request_bytes"] = min(
                    limits["max_request_bytes"], args.max_request_bytes
                )
            bodies = _requests(sessions, notes, limits, memories)
            pending, failed = _send(client, bodies, len(sessions), args.agent)
            if not (args.no_wait or pending == 0):
                return _wait(client, pending, failed, args.timeout)
            if failed:
                return _embeddings_failed(failed)
            return 0
        except httpx.HTTPError as exc:
            err(f"! cannot reach {args.url}: {exc}")
            err("  run the same command again: what was imported is skipped")
            return 1


def read_file(path: Path) -> dict[str, Any]:
    """The file's document, checked whole: JSON, else NDJSON (an export's).
    Every malformed record is named before anything is sent."""
    from memchat.errors import MemchatError
    from memchat.usecases import history_import

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        err(f"! cannot read {path}: {exc}")
        raise Handled() from None
    try:
        document = history_import.parse_json(text)
    except ValueError as not_json:
        try:
            document = from_ndjson(text)
        except ValueError as not_ndjson:
            err(f"! {path} is neither JSON ({not_json}) nor an export's NDJSON ({not_ndjson})")
            raise Handled() from None
    try:
        history_import.read_document(document)
    except MemchatError as exc:
        err(f"! {path}: {exc.detail}")
        raise Handled() from None
    assert isinstance(document, dict)  # read_document refuses anything else
    return document


def from_ndjson(text: str) -> dict[str, Any]:
    """An export's NDJSON form as its JSON form: the account's (an `export`
    line, `session` lines each followed by its `message` lines, then
    `active_session`, `long_term_memory` and `memory` lines) or one session's (its
    `session` line, then its `message` lines). ValueError names the line."""
    from memchat.usecases.history_import import parse_json

    sessions: dict[str, dict[str, Any]] = {}
    notes: list[Any] = []
    memories: list[Any] = []
    head: dict[str, Any] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = parse_json(line)
        except ValueError:
            raise ValueError(f"line {number} is not JSON") from None
        if not isinstance(item, dict):
            raise ValueError(f"line {number} is not a JSON object")
        kind = item.pop("type", None)
        if kind == "session":
            sessions[str(item.get("id"))] = {**item, "messages": []}
        elif kind == "message":
            owner = sessions.get(str(item.pop("session_id", None)))
            if owner is None:
                raise ValueError(f"line {number}: a message before its session's line")
            owner["messages"].append(item)
        elif kind == "long_term_memory":
            notes.append(item)
        elif kind == "memory":
            memories.append(item)
        elif kind == "export":
            head = item
        elif kind != "active_session":
            raise ValueError(f"line {number} is not a line of a memchat export")
    if not head and len(sessions) == 1:
        (session,) = sessions.values()
        return {"session": session, "messages": session.pop("messages")}
    document = {**head, "sessions": list(sessions.values()), "long_term_memory": notes}
    return {**document, "memories": memories} if memories else document


def sessions_of(document: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """A (checked) document's sessions and notes as the file has them, in the
    form a request carries them (one session's export becomes a session)."""
    if "session" in document and "sessions" not in document:
        return [{**document["session"], "messages": document["messages"]}], []
    return list(document["sessions"]), list(document.get("long_term_memory") or [])


def durable_memories(document: dict[str, Any], sessions: Sequence[Any]) -> list[Any]:
    """An account export's memories of sessions the file does not hold
    (their transcript gone): the server makes the others again from the
    messages, and a request must not take one whose session a later request
    brings for one gone."""
    held = {str(s.get("id")) for s in sessions if s.get("id") is not None}
    return [m for m in document.get("memories") or [] if str(m.get("session_id")) not in held]


def chunks(
    sessions: Sequence[Any],
    notes: Sequence[Any],
    *,
    max_bytes: int,
    max_sessions: int,
    memories: Sequence[Any] = (),
) -> Iterator[dict[str, Any]]:
    """The request bodies that carry `sessions` in order (the first also
    `notes` and `memories`), each at most `max_sessions` sessions and
    `max_bytes` bytes as `request_body` writes it. ValueError names what
    fits in no request."""
    overhead = len(request_body({"sessions": []}))
    body: list[Any] = []
    extra: dict[str, Any] = {"long_term_memory": list(notes)} if notes else {}
    if memories:
        extra["memories"] = list(memories)
    size = overhead + len(request_body(extra))  # its braces pay for the comma
    if size > max_bytes:
        raise ValueError(f"long_term_memory and memories alone are over {max_bytes} bytes")
    for index, session in enumerate(sessions):
        length = len(request_body(session)) + 1  # and its comma
        if overhead + length > max_bytes:
            raise ValueError(f"sessions[{index}] alone is over {max_bytes} bytes")
        if body and (size + length > max_bytes or len(body) >= max_sessions):
            yield {"sessions": body, **extra}
            body, extra, size = [], {}, overhead
        body.append(session)
        size += length
    if body or extra:
        yield {"sessions": body, **extra}


def request_body(value: Any) -> bytes:
    """A request's body: compact JSON, UTF-8."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _token(args: argparse.Namespace) -> str:
    from memchat.cli.login import api_token

    return api_token(args.url, args.token).token


def _limits(client: Any) -> dict[str, int]:
    """What one import request may hold, as the server says."""
    r = client.get(STATUS_PATH)
    if r.status_code == 404:
        return dict(FALLBACK_LIMITS)
    _raise_for(r)
    return {key: int(value) for key, value in r.json()["limits"].items()}


def _requests(
    sessions: list[Any], notes: list[Any], limits: dict[str, int], memories: list[Any]
) -> list[dict[str, Any]]:
    most = limits["max_messages_per_session"]
    for index, session in enumerate(sessions):
        if len(session.get("messages") or ()) > most:
            err(f"! sessions[{index}] has more than {most} messages, the server's limit")
            raise Handled()
    try:
        return list(
            chunks(
                sessions,
                notes,
                max_bytes=limits["max_request_bytes"],
                max_sessions=limits["max_sessions_per_request"],
                memories=memories,
            )
        )
    except ValueError as exc:
        err(f"! {exc}, the server's limit for one request")
        raise Handled() from None


def _send(client: Any, bodies: Iterable[dict[str, Any]], total: int, agent: str) -> tuple[int, int]:
    """Send each request; returns how many of the account's messages wait for
    embeddings, and how many the backfill gave up on."""
    bar = Progress("sessions", total)
    imported = skipped = messages = 0
    pending = failed = 0
    try:
        for body in bodies:
            result = _post(client, body, agent)
            imported += result["imported_sessions"]
            skipped += result["skipped_sessions"]
            messages += result["imported_messages"]
            pending = result["embeddings_pending"]
            failed = result.get("embeddings_failed", 0)  # an older server: not said
            bar.update(imported + skipped)
    finally:
        bar.close()
    print(
        f"imported {imported} sessions ({messages} messages);"
        f" skipped {skipped} this account has already"
    )
    return int(pending), int(failed)


def _post(client: Any, body: dict[str, Any], agent: str) -> dict[str, Any]:
    """One import request, sent until it is answered: a 429 waits its
    Retry-After, a server or network failure is retried RETRIES times."""
    import httpx2 as httpx

    content = request_body(body)
    failures = 0
    while True:
        try:
            r = client.post(
                IMPORT_PATH,
                content=content,
                params={"agent_name": agent},
                headers={"Content-Type": "application/json"},
            )
        except httpx.TransportError:
            r = None
        if r is not None and r.status_code == 429:
            time.sleep(min(60.0, float(r.headers.get("retry-after", "1"))))
            continue
        if r is None or r.status_code >= 500:
            failures += 1
            if failures <= RETRIES:
                time.sleep(2.0**failures)
                continue
            if r is None:
                raise httpx.TransportError("no answer")
        _raise_for(r)
        result: dict[str, Any] = r.json()
        return result


def _wait(client: Any, pending: int, failed: int, timeout: float) -> int:
    """Poll the status until no message waits for an embedding, or `timeout`.
    Messages whose embeddings the backfill gives up on meanwhile wait no
    more: they are reported at the end (EMBEDDINGS_FAILED)."""
    bar = Progress("embedded", pending)
    deadline = time.monotonic() + timeout
    left, given_up = pending, failed
    try:
        while left > 0 and time.monotonic() < deadline:
            time.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
            r = client.get(STATUS_PATH)
            _raise_for(r)
            status = r.json()
            left = int(status["embeddings_pending"])
            given_up = int(status.get("embeddings_failed", 0))
            bar.update(max(0, pending - left - max(0, given_up - failed)))
    finally:
        bar.close()
    if left > 0:
        print(f"{left} messages still wait for embeddings; recall finds them once embedded")
    if given_up:
        return _embeddings_failed(given_up)
    if left > 0:
        return WAIT_TIMED_OUT
    print("recall is ready: every imported message is embedded")
    return 0


def _embeddings_failed(failed: int) -> int:
    """Say that the backfill gave up on `failed` of the account's messages."""
    err(
        f"! embeddings failed for {failed} messages of this account: the embeddings"
        " provider failed again and again, and the backfill gave up on their sessions,"
        " so recall cannot find them"
    )
    err(
        "  fix the provider (the summary worker's log says why), then import again the"
        " files they came from (this command again, for this file's): an import queues"
        " its sessions for embeddings again"
    )
    return EMBEDDINGS_FAILED


def _raise_for(response: Any) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
        message = f"{body.get('error')}: {body.get('detail')}"
    except ValueError:
        message = response.text[:200]
    err(f"! {response.status_code} {message}")
    if response.request.url.path == IMPORT_PATH:
        err("  fix it and run the same command again: what was imported is skipped")
    raise Handled()


class Progress:
    """A progress bar redrawn in place on a terminal; elsewhere a line per change."""

    WIDTH = 30

    def __init__(self, label: str, total: int, out: IO[str] | None = None) -> None:
        self.label = label
        self.total = total
        self.out = out or sys.stdout
        self.terminal = self.out.isatty()
        self.shown = -1
        self.update(0)

    def update(self, done: int) -> None:
        if done == self.shown:
            return
        self.shown = done
        if self.terminal:
            filled = self.WIDTH * done // self.total if self.total else self.WIDTH
            bar = "#" * filled + "." * (self.WIDTH - filled)
            self.out.write(f"\r{self.label} [{bar}] {done}/{self.total}")
        else:
            self.out.write(f"{self.label}: {done}/{self.total}\n")
        self.out.flush()

    def close(self) -> None:
        if self.terminal:
            self.out.write("\n")
            self.out.flush()


DESCRIPTION = """\
Import conversations from FILE into an account, with their original times.

FILE is a memchat export (GET /export or GET /chat/export/{id}, JSON or
NDJSON) or the plain shape:
  {"sessions": [{"id"?, "agent_name"?, "title"?,
                 "messages": [{"role": "user" | "assistant", "content": "...",
                               "created_at": "2024-05-01T09:30:00Z"}]}]}

Sessions this account has already are skipped, so running the same command
again after a failure imports only what is missing. Then it waits until
recall sees the imported messages (exit code 3 if --timeout passes first;
4 if the embeddings of some of the account's messages failed for good:
running it again queues them again).
"""


def register(commands: Subcommands) -> None:
    parser = add_described_command(
        commands, "import", "import conversations from a file (an export or the plain shape)",
        DESCRIPTION,
    )  # fmt: skip
    parser.add_argument("file", help="the file to import")
    parser.add_argument("--url", default=os.environ.get("MEMCHAT_URL", DEFAULT_URL))
    parser.add_argument(
        "--token", default=None, help="access token (default: `memchat login`'s, or a local one)"
    )
    parser.add_argument(
        "--agent", default="default", help="the agent of sessions that name none (default: default)"
    )
    parser.add_argument(
        "--no-wait", action="store_true", help="do not wait for the imported messages' embeddings"
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds to wait for them (default: 600)"
    )
    parser.add_argument(
        "--max-request-bytes",
        type=int,
        default=None,
        help="send requests of at most this many bytes (default: what the server takes)",
    )
    parser.set_defaults(func=cmd_import)
