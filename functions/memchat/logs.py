"""What memchat's log records hold, and how `memchat dev` prints them.

- One access record per request (`ACCESS`, logged by
  `memchat.api.middleware.RequestContext` when the response has ended, a streamed
  one included) with the fields `method`, `route` (the route's template, e.g.
  /chat/export/{session_id}: never the raw path or its query string),
  `status`, `duration_ms`, `request_id` (memchat's own: API Gateway's
  request id, else a generated one), `user_id` (the verified token's `sub`,
  when authentication succeeded) and, when the client sent an X-Request-ID
  that matches `^[A-Za-z0-9._:-]{1,64}$`, `client_request_id` (any other is
  neither logged nor used). Deployed, Powertools writes it as one JSON
  object (memchat.observability); in `memchat dev`, `DevFormatter` writes
  it as an access line:

      18:20:31 POST /chat 200 412.3 ms req=0c1f… user=6f0c2a34-… client_req=web-7

- An unexpected error (`UNEXPECTED`) is logged with `error_fields(exc)`: its
  type, where it was raised (module, line, function) and the deepest frame of
  memchat's own code, plus the frames' source lines at DEBUG; never the
  exception's message, which can quote the request's content.
- Every record logged while a request is served carries its `request_id`
  (`RequestIdFilter`), so a warning deep in a turn finds its access line.

No record holds message text, notes, tokens or query strings.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from types import TracebackType
from typing import IO, Any

ACCESS = "request"
UNEXPECTED = "unhandled error"

_request_id: ContextVar[str | None] = ContextVar("memchat_request_id", default=None)


@contextmanager
def request_scope(request_id: str) -> Iterator[None]:
    """Records logged inside the block (and tasks it starts) carry `request_id`."""
    token = _request_id.set(request_id)
    try:
        yield
    finally:
        _request_id.reset(token)


class RequestIdFilter(logging.Filter):
    """Stamps the current request's id on records that do not name one;
    with `correlation_id=True` also as `correlation_id` (for Powertools JSON,
    where a handler without Lambda's own correlation id has none)."""

    def __init__(self, *, correlation_id: bool = False) -> None:
        super().__init__()
        self.correlation_id = correlation_id

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = getattr(record, "request_id", None) or _request_id.get()
        if request_id:
            record.request_id = request_id
            if self.correlation_id and not getattr(record, "correlation_id", None):
                record.correlation_id = request_id
        return True


# ---------------------------------------------------------------- errors


def _qualified(kind: type[BaseException]) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _unwrapped(exc: BaseException) -> BaseException:
    """The one exception inside (nested) single-exception groups (task groups wrap)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _frames(tb: TracebackType | None) -> list[tuple[str, int, str, str]]:
    """(module, line, function, file name) of each frame, outermost first."""
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        module = str(tb.tb_frame.f_globals.get("__name__", "?"))
        frames.append((module, tb.tb_lineno, code.co_name, code.co_filename.rsplit("/", 1)[-1]))
        tb = tb.tb_next
    return frames


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and the exceptions it was raised from or while handling, oldest first."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    return chain[::-1]


def traceback_text(exc: BaseException) -> str:
    """The traceback of `exc` and its chain: frames and source lines, and each
    exception's type, never its message (which can quote a user's text)."""
    parts = []
    for index, item in enumerate(_chain(exc)):
        if index:
            caused = item.__cause__ is not None
            parts.append(
                "\nThe above exception was the direct cause of the following exception:\n\n"
                if caused
                else "\nDuring handling of the above exception, another exception occurred:\n\n"
            )
        parts.append("Traceback (most recent call last):\n")
        parts.extend(traceback.format_list(traceback.extract_tb(item.__traceback__)))
        parts.append(f"{_qualified(type(item))} (message not logged)\n")
    return "".join(parts).rstrip("\n")


def error_fields(exc: BaseException, *, with_traceback: bool = False) -> dict[str, Any]:
    """Log fields for an unexpected exception: its type, where it was raised
    (`error_module`, `error_line`, `error_function`), the deepest frame of
    memchat's code (`app_frame`), the last frames (`where`) and the type of
    the exception it came from (`error_cause`); `traceback` when asked for.
    Never its message: exception texts can quote the request's content."""
    exc = _unwrapped(exc)
    frames = _frames(exc.__traceback__)
    fields: dict[str, Any] = {
        "error_type": _qualified(type(exc)),
        "where": [f"{file}:{line} {function}" for _, line, function, file in frames[-5:]],
    }
    if frames:
        module, line, function, _ = frames[-1]
        fields.update(error_module=module, error_line=line, error_function=function)
    own = [f for f in frames if f[0] == "memchat" or f[0].startswith("memchat.")]
    if own:
        module, line, function, _ = own[-1]
        fields["app_frame"] = f"{module}:{line} {function}"
    chain = _chain(exc)
    if len(chain) > 1:
        fields["error_cause"] = _qualified(type(chain[-2]))
    if with_traceback:
        fields["traceback"] = traceback_text(exc)
    return fields


# ------------------------------------------------------------ memchat dev

# What every LogRecord has: everything else was passed as `extra=`.
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}
# Printed by the line itself (or, for `traceback`, under it).
_NOT_AS_FIELDS = {
    "request_id",
    "correlation_id",
    "traceback",
    "error_type",
    "error_module",
    "error_line",
    "error_function",
    "app_frame",
    "where",  # in the JSON line; here the innermost frame and memchat's say enough
}


def access_line(fields: dict[str, Any]) -> str:
    """`POST /chat 200 412.3 ms req=… user=…` from an access record's fields,
    then `client_req=…` when the client sent its own (safe) id."""
    status = fields.get("status") or "-"
    line = (
        f"{fields.get('method', '?')} {fields.get('route') or '(no route)'} {status}"
        f" {float(fields.get('duration_ms') or 0):.1f} ms"
        f" req={fields.get('request_id') or '-'} user={fields.get('user_id') or '-'}"
    )
    if fields.get("client_request_id"):
        line += f" client_req={fields['client_request_id']}"
    if fields.get("client_gone"):
        line += " (client gone)"
    return line


class DevFormatter(logging.Formatter):
    """Readable lines for `memchat dev`: the access line for each request;
    other records as `time LEVEL logger: message key=value… req=…`, an
    unexpected error with its type and place, and its frames under it (DEBUG)."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = self.formatTime(record, "%H:%M:%S")
        fields = record.__dict__
        message = record.getMessage()
        if message == ACCESS and "route" in fields and "status" in fields:
            return f"{stamp} {access_line(fields)}"
        text = f"{stamp} {record.levelname} {record.name}: {message}"
        if "error_type" in fields:
            text += f" {fields['error_type']}"
            if "error_module" in fields:
                text += f" at {fields['error_module']}:{fields['error_line']}"
            if "app_frame" in fields:
                text += f" (in {fields['app_frame']})"
        extras = {
            key: value
            for key, value in fields.items()
            if key not in _STANDARD and key not in _NOT_AS_FIELDS
        }
        for key, value in extras.items():
            text += f" {key}={value}"
        if fields.get("request_id"):
            text += f" req={fields['request_id']}"
        if fields.get("traceback"):
            text += "\n" + str(fields["traceback"])
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure_dev(level: str = "INFO", stream: IO[str] | None = None) -> None:
    """Logging for `memchat dev`: readable lines on stderr; memchat's records
    from `level` (LOG_LEVEL), every other library's from WARNING only (their
    DEBUG records can hold request bodies)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(DevFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("memchat").setLevel(level.upper())
