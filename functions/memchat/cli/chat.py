"""`memchat chat`: chat in the terminal, each answer printed as it streams.

Before the first prompt it checks that the API answers (GET /health) and
takes the token (an authenticated GET /sessions): either failing is said
once, with what to do, and the command exits 1. Each run starts a new
session (an id of its own, so never the agent's active one); resuming one
is explicit (--session, or /resume). The exit code is 1 when any request
of the run failed, 0 otherwise.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from memchat.cli.base import Handled
from memchat.sse_reader import Event, SSEReader

if TYPE_CHECKING:
    import argparse

    from memchat.cli.base import Subcommands
    from memchat.cli.login import ApiToken

DEFAULT_URL = "http://127.0.0.1:8000"
SSE_MEDIA_TYPE = "text/event-stream"
SESSIONS_LISTED = 10  # /sessions shows this many
SESSIONS_SEARCHED = 100  # /resume and /clear look among this many (the API's page limit)

COMMANDS = """commands:
  /help              this list
  /new               start a new session
  /sessions          your latest sessions of this agent (* the one shown)
  /resume ID         go on with a session (its id, or the first characters of it)
  /clear             delete this session's messages (asks first; notes stay)
  /export [FILE]     save this session as JSON (default: ~/memchat-session-<id>.json)
  /notes             the long-term notes (what the agent remembers about you)
  /quit              leave (or Ctrl-D); Ctrl-C stops an answer (the server still stores it)"""


class ChatRun:
    """One `memchat chat`: its client, agent, session, and failures so far."""

    def __init__(self, client: Any, url: str, token: ApiToken, agent: str) -> None:
        self.client = client
        self.url = url
        self.token = token
        self.agent = agent
        self.session_id = str(uuid.uuid4())
        self.failures = 0

    # -------------------------------------------------------------- checks

    def check(self) -> bool:
        """The API answers and takes the token; else said once, with what to do."""
        import httpx2 as httpx

        try:
            health = self.client.get("/health", timeout=10)
        except httpx.HTTPError as exc:
            start = " (start it with `memchat dev`)" if _is_local(self.url) else ""
            print(f"! cannot reach the API at {self.url}{start}: {exc}; or pass --url")
            return False
        if health.status_code != 200:
            print(f"! the API at {self.url} is not healthy: {_error_text(health)}")
            return False
        try:
            self._get_json("/sessions", {"agent_name": self.agent, "limit": 1})
        except Handled:
            return False
        return True

    # ------------------------------------------------------------ commands

    def run(self, line: str) -> None:
        """One line: a command, or a message for the agent."""
        command, _, argument = line.partition(" ")
        argument = argument.strip()
        handlers: dict[str, Callable[[], object]] = {
            "/help": lambda: print(COMMANDS),
            "/new": self.new,
            "/sessions": self.sessions,
            "/resume": lambda: self.resume(argument),
            "/clear": self.clear,
            "/export": lambda: self.export(argument),
            "/notes": self.notes,
        }
        if command in handlers:
            handlers[command]()
        elif line.startswith("/") and " " not in line:
            print(f"(no command {line}: /help lists them)")
        else:
            self.turn(line)

    def new(self) -> None:
        self.session_id = str(uuid.uuid4())
        print(f"(new session {self.session_id})")

    def sessions(self) -> None:
        listed = self._sessions(SESSIONS_LISTED)
        if not listed:
            print(f"(no sessions of agent {self.agent} yet)")
            return
        for s in listed:
            mark = "*" if s["id"] == self.session_id else " "
            title = f"  {s['title']}" if s.get("title") else ""
            print(
                f"{mark} {s['id']}  {_messages(s['message_count'])}  {s['status']}"
                f"  last active {s['last_active_at'][:16].replace('T', ' ')}{title}"
            )
        if all(s["id"] != self.session_id for s in listed):
            print(f"* {self.session_id}  (this one: nothing stored yet)")
        print("(/resume ID goes on with one)")

    def resume(self, prefix: str) -> bool:
        """Goes on with the session whose id starts with `prefix`; whether it did."""
        prefix = prefix.lower()
        if not prefix:
            print("(which one? /resume ID: /sessions lists them)")
            return False
        matches = [s for s in self._sessions(SESSIONS_SEARCHED) if s["id"].startswith(prefix)]
        if len(matches) != 1:
            found = "no session" if not matches else f"{len(matches)} sessions"
            print(f"({found} of agent {self.agent} starting with {prefix}: /sessions lists them)")
            return False
        self.session_id = matches[0]["id"]
        print(f"(resumed session {self.session_id}: {_messages(matches[0]['message_count'])})")
        return True

    def clear(self) -> None:
        """Deletes this session's messages, once the user says yes."""
        stored = self._stored_session()
        if stored is None or not stored["message_count"]:
            print("(nothing to clear yet)")
            return
        question = (
            f"delete the {_messages(stored['message_count'])} of session {self.session_id}"
            " for good? The long-term notes stay (/notes). [y/N] "
        )
        try:
            answer = input(question).strip().lower()
        except EOFError:
            answer = ""
            print()
        if answer not in ("y", "yes"):
            print("(not cleared)")
            return
        body = {"session_id": self.session_id, "agent_name": self.agent}
        cleared = self._checked(self.client.post("/chat/clear-session", json=body))
        self.session_id = cleared["new_session_id"]
        deleted = _messages(cleared["deleted_messages"])
        print(f"(cleared {deleted}; new session {self.session_id})")

    def export(self, path_text: str) -> None:
        r = self.client.get(f"/chat/export/{self.session_id}", params={"format": "json"})
        if r.status_code == 404:
            print("(nothing to export yet)")
            return
        self._checked(r)
        path = Path(path_text).expanduser() if path_text else _default_export(self.session_id)
        try:
            path.write_bytes(r.content)
        except OSError as exc:
            self._failed(f"cannot write {path}: {exc.strerror}")
        print(f"(exported session {self.session_id} to {path})")

    def notes(self) -> None:
        notes = self._get_json("/memory", {"agent_name": self.agent})["notes"]
        print(notes or "(no notes yet)")

    def turn(self, line: str) -> None:
        """One turn as Server-Sent Events, its answer printed as the model writes it.

        Failures before the stream starts are HTTP errors; an `error` event is
        printed and the session stays usable. Ctrl-C stops the printing only:
        the server still finishes and stores the turn."""
        out = _AnswerPrinter(f"{self.agent}> ")
        body = {"message": line, "session_id": self.session_id, "agent_name": self.agent}
        headers = {"Accept": SSE_MEDIA_TYPE}
        try:
            with self.client.stream("POST", "/chat", json=body, headers=headers) as r:
                if r.status_code >= 400:
                    r.read()
                    self._checked(r)
                for event, data in _json_events(r.iter_bytes()):
                    if event == "delta":
                        out.write(str(data.get("text", "")))
                    elif event == "notes":
                        out.notice(f"(notes: {data.get('operation')})")
                    elif event == "done":
                        out.finish(str(data.get("answer", "")), _notes_updated(data))
                        return
                    elif event == "error":
                        self.failures += 1
                        out.notice(f"! {data.get('error')}: {data.get('detail')}\n")
                        return
                self.failures += 1
                out.notice("! the answer ended early: the connection closed\n")
        except KeyboardInterrupt:
            out.notice("(stopped; the server still finishes and stores this turn)\n")
        finally:
            out.end_line()

    # ------------------------------------------------------------- helpers

    def _sessions(self, limit: int) -> list[dict[str, Any]]:
        page = self._get_json("/sessions", {"agent_name": self.agent, "limit": limit})
        sessions: list[dict[str, Any]] = page["sessions"]
        return sessions

    def _stored_session(self) -> dict[str, Any] | None:
        """This session as GET /sessions lists it; None before it stores anything."""
        found = (s for s in self._sessions(SESSIONS_SEARCHED) if s["id"] == self.session_id)
        return next(found, None)

    def _get_json(self, path: str, params: dict[str, Any]) -> dict[str, Any]:
        return self._checked(self.client.get(path, params=params))

    def _checked(self, response: Any) -> dict[str, Any]:
        """The response's JSON; an error response said (with what to do about
        a refused token), then `Handled` (the session goes on)."""
        if response.status_code < 400:
            body: dict[str, Any] = response.json() if response.content else {}
            return body
        message = f"{response.status_code} {_error_text(response)}"
        if response.status_code == 401 and "memchat " not in message:
            message += f"\n  {self.token.refused_hint(self.url)}"
        self._failed(message)

    def _failed(self, message: str) -> NoReturn:
        self.failures += 1
        print(f"! {message}")
        raise Handled()


def cmd_chat(args: argparse.Namespace) -> int:
    import httpx2 as httpx  # ships with the openai SDK (>= 3)

    from memchat.cli.login import api_token

    token = api_token(args.url, args.token)
    headers = {"Authorization": f"Bearer {token.token}"}
    with httpx.Client(base_url=args.url, headers=headers, timeout=120) as client:
        chat = ChatRun(client, args.url, token, args.agent)
        if not chat.check():
            return 1
        if args.session:
            try:
                if not chat.resume(args.session):
                    return 1
            except Handled:
                return 1
        else:
            print(f"memchat · agent {args.agent} · new session {chat.session_id}")
        print("/help lists the commands; Ctrl-D or /quit to leave.\n")
        _loop(chat)
    print(f"bye (session {chat.session_id})")
    if chat.failures:
        print(f"{_plural(chat.failures, 'request')} of this run failed", file=sys.stderr)
        return 1
    return 0


def _loop(chat: ChatRun) -> None:
    import httpx2 as httpx

    while True:
        try:
            line = input("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            return
        if not line:
            continue
        if line in ("/quit", "/exit"):
            return
        try:
            chat.run(line)
        except httpx.HTTPError as exc:
            chat.failures += 1
            print(f"! cannot reach {chat.url}: {exc}")
        except Handled:
            continue
        except KeyboardInterrupt:
            print()
            return


def _is_local(url: str) -> bool:
    from memchat.cli.login import is_local

    return is_local(url)


def _default_export(session_id: str) -> Path:
    """Where /export writes with no FILE: the home directory, never the working one
    (which may be a clone of the repository)."""
    return Path.home() / f"memchat-session-{session_id}.json"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _messages(count: int) -> str:
    return _plural(count, "message")


def _error_text(response: Any) -> str:
    try:
        body = response.json()
        return f"{body.get('error')}: {body.get('detail')}"
    except ValueError:
        return str(response.text[:200])


def _notes_updated(done: dict[str, Any]) -> bool:
    memory = done.get("memory")
    return isinstance(memory, dict) and memory.get("long_term_notes_updated") is True


def _json_events(chunks: Iterable[bytes]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, data) of each Server-Sent Event whose data is a JSON object;
    comments and anything else are skipped."""
    reader = SSEReader()
    for chunk in chunks:
        for item in reader.feed(chunk):
            if not isinstance(item, Event):
                continue
            try:
                data = json.loads(item.text)
            except ValueError:
                continue
            if isinstance(data, dict):
                yield item.name, data


class _AnswerPrinter:
    """Prints an answer piece by piece after its prefix; notices on lines of their own."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._printed = ""
        self._open = False  # a line of the answer is being written

    def write(self, text: str) -> None:
        if not text:
            return
        if not self._open:
            # After a notice the answer goes on, indented under its prefix.
            sys.stdout.write(self._prefix if not self._printed else " " * len(self._prefix))
            self._open = True
        sys.stdout.write(text)
        sys.stdout.flush()
        self._printed += text

    def end_line(self) -> None:
        if self._open:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self._open = False

    def notice(self, message: str) -> None:
        self.end_line()
        print(message, flush=True)

    def finish(self, answer: str, notes_updated: bool) -> None:
        """The stored answer (done.answer): what streamed, unless it differs."""
        if not self._printed or not self._printed.endswith(answer):
            self.end_line()
            sys.stdout.write(self._prefix + answer)
            self._open = True
        note = " (notes updated)" if notes_updated else ""
        print(note, flush=True)
        self._open = False
        print()


def register(commands: Subcommands) -> None:
    chat = commands.add_parser(
        "chat",
        help="chat in the terminal (a new session per run; /help for commands)",
        description=__doc__,
    )
    chat.add_argument("--agent", default="default")
    chat.add_argument("--url", default=os.environ.get("MEMCHAT_URL", DEFAULT_URL))
    chat.add_argument(
        "--token", default=None, help="access token (default: `memchat login`'s, or a local one)"
    )
    chat.add_argument("--session", default=None, help="go on with this session (its id)")
    chat.set_defaults(func=cmd_chat)
