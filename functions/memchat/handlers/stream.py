"""The streaming functions' server, behind the AWS Lambda Web Adapter.

ExportFunction (ROUTE_GROUPS=export: the two exports, which can pass API
Gateway's 6 MB) and ChatStreamFunction (ROUTE_GROUPS=chat: POST /chat's
Server-Sent Events) serve from a function URL in RESPONSE_STREAM mode. The
adapter layer runs the package's `run.sh`, which execs `python -m
memchat.handlers.stream`: the app as memchat.bootstrap.stream_app builds it
(only the group's streamed routes: memchat.api.streamed), served by uvicorn
on 127.0.0.1:$AWS_LWA_PORT. The adapter waits until GET /health answers,
then relays each function-URL request and streams the response back as it
is written.

    ROUTE_GROUPS=export AWS_LWA_PORT=8081 python -m memchat.handlers.stream   # the exports
    ROUTE_GROUPS=chat AWS_LWA_PORT=8082 python -m memchat.handlers.stream     # the chat stream
"""

from __future__ import annotations

import os

HOST = "127.0.0.1"  # only the adapter, in the same sandbox, connects
DEFAULT_PORT = 8080  # the adapter's default AWS_LWA_PORT


def port() -> int:
    raw = os.environ.get("AWS_LWA_PORT", "").strip()
    return int(raw) if raw else DEFAULT_PORT


def main() -> None:
    import uvicorn

    from memchat import bootstrap

    uvicorn.run(
        bootstrap.stream_app(),
        host=HOST,
        port=port(),
        lifespan="off",  # the app holds no lifespan state; its state is built eagerly
        log_config=None,  # keep the JSON logging the app's settings configured
        access_log=False,  # the app logs one line per request itself
    )


if __name__ == "__main__":
    main()
