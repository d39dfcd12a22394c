"""`memchat chat`: chat in the terminal, each answer printed as it streams."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from memchat.cli.base import Handled
from memchat.cli.token import DEFAULT_EMAIL, mint_local_token
from memchat.sse_reader import Event, SSEReader

if TYPE_CHECKING:
    import argparse

    from memchat.cli.base import Subcommands

DEFAULT_URL = "http://127.0.0.1:8000"
SSE_MEDIA_TYPE = "text/event-stream"


def cmd_chat(args: argparse.Namespace) -> int:
    import httpx2 as httpx  # ships with the openai SDK (>= 3)

    token = (
        args.token
        or os.environ.get("MEMCHAT_TOKEN")
        or mint_local_token(None, DEFAULT_EMAIL, 3600 * 12)
    )
    session_id = str(uuid.uuid4())  # an ephemeral session for this run
    headers = {"Authorization": f"Bearer {token}"}
    print(f"memchat · agent {args.agent} · session {session_id}")
    print("Ctrl-D or /quit to leave, /clear to start over, /notes to see long-term notes;")
    print("Ctrl-C stops an answer (the server still stores it).\n")
    with httpx.Client(base_url=args.url, headers=headers, timeout=120) as client:
        while True:
            try:
                line = input("you> ").strip()
            except (EOFError, KeyboardInterrupt):
                print()
                break
            if not line:
                continue
            if line in ("/quit", "/exit"):
                break
            try:
                session_id = _chat_command(client, line, session_id, args.agent)
            except httpx.HTTPError as exc:
                print(f"! cannot reach {args.url}: {exc}")
            except Handled:
                continue
            except KeyboardInterrupt:
                print()
                break
    print(f"bye (session {session_id})")
    return 0


def _chat_command(client: Any, line: str, session_id: str, agent: str) -> str:
    """Run one line (/clear, /notes, or a message); the session id after it."""
    if line == "/clear":
        r = client.post("/chat/clear-session", json={"session_id": session_id, "agent_name": agent})
        if r.status_code == 404:
            print("(nothing to clear yet)")
            return session_id
        _raise_for(r)
        new_id: str = r.json()["new_session_id"]
        print(f"(cleared {r.json()['deleted_messages']} messages; new session {new_id})")
        return new_id
    if line == "/notes":
        r = client.get("/memory", params={"agent_name": agent})
        _raise_for(r)
        print(r.json()["notes"] or "(no notes yet)")
        return session_id
    _stream_turn(client, line, session_id, agent)
    return session_id


def _stream_turn(client: Any, line: str, session_id: str, agent: str) -> None:
    """One turn as Server-Sent Events, its answer printed as the model writes it.

    Failures before the stream starts are HTTP errors (`_raise_for`); an
    `error` event is printed and the session stays usable. Ctrl-C stops the
    printing only: the server still finishes and stores the turn."""
    out = _AnswerPrinter(f"{agent}> ")
    body = {"message": line, "session_id": session_id, "agent_name": agent}
    try:
        with client.stream("POST", "/chat", json=body, headers={"Accept": SSE_MEDIA_TYPE}) as r:
            if r.status_code >= 400:
                r.read()
                _raise_for(r)
            for event, data in _json_events(r.iter_bytes()):
                if event == "delta":
                    out.write(str(data.get("text", "")))
                elif event == "notes":
                    out.notice(f"(notes: {data.get('operation')})")
                elif event == "done":
                    out.finish(str(data.get("answer", "")), _notes_updated(data))
                    return
                elif event == "error":
                    out.notice(f"! {data.get('error')}: {data.get('detail')}\n")
                    return
            out.notice("! the answer ended early: the connection closed\n")
    except KeyboardInterrupt:
        out.notice("(stopped; the server still finishes and stores this turn)\n")
    finally:
        out.end_line()


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


def _raise_for(response: Any) -> None:
    """An error response printed, then `Handled` (the session goes on)."""
    if response.status_code >= 400:
        try:
            body = response.json()
            message = f"{body.get('error')}: {body.get('detail')}"
        except ValueError:
            message = response.text[:200]
        print(f"! {response.status_code} {message}")
        raise Handled()


def register(commands: Subcommands) -> None:
    chat = commands.add_parser("chat", help="chat in the terminal (a new session per run)")
    chat.add_argument("--agent", default="default")
    chat.add_argument("--url", default=os.environ.get("MEMCHAT_URL", DEFAULT_URL))
    chat.add_argument("--token", default=None, help="access token (default: a local dev token)")
    chat.set_defaults(func=cmd_chat)
