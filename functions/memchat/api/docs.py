"""The interactive API docs at /docs, offline: Swagger UI's page with its
assets served by the app itself, never from a CDN.

The assets are the ones the `fastapi-offline` package ships (Swagger UI 5,
which renders the OpenAPI 3.1 document FastAPI writes; swagger-ui-bundle's
Swagger UI 4 cannot). Only its files are used, not its code. It is in the
`dev` extra, not in the Lambda package: deployed, /docs is routed nowhere.
Without it the app serves no /docs; /openapi.json is served either way.

The page loads /openapi.json, which declares the bearer scheme (deps.py), so
Swagger UI's "Authorize" takes a Supabase access token for "Try it out".
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.responses import FileResponse, HTMLResponse

DOCS_URL = "/docs"
ASSETS_URL = "/docs/assets"

PACKAGE = "fastapi_offline"
# The only files served from the package: what the page loads (not its
# ReDoc, which the app does not serve).
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon.png": "image/png",
}
# The assets' URLs carry the package's version (/docs/assets/1.7.7/...).
CACHE = {"Cache-Control": "public, max-age=86400"}
# The page may load and call nothing but this origin (the inline script is
# FastAPI's page set-up; Swagger UI styles elements inline and draws icons
# from data: URLs).
CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline';"
    " img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none';"
    " frame-ancestors 'none'"
)


def swagger_ui_dir() -> Path | None:
    """The installed package's folder of Swagger UI files, or None. Found
    without importing the package (nothing of it runs)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent / "static"
    return folder if all((folder / name).is_file() for name in ASSETS) else None


def _version() -> str:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return "local"


def install(app: FastAPI) -> bool:
    """Adds GET /docs and its assets to `app` when the package is installed;
    returns whether it did. Create the app with `docs_url=None,
    redoc_url=None`: FastAPI's own pages load their files from a CDN."""
    folder = swagger_ui_dir()
    if folder is None or app.openapi_url is None:
        return False
    openapi_url = app.openapi_url
    base = f"{ASSETS_URL}/{_version()}"

    async def swagger_ui(request: Request) -> HTMLResponse:
        # Behind a path prefix (root_path) every URL keeps it: same origin, same prefix.
        root = str(request.scope.get("root_path", "")).rstrip("/")
        page = get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} API docs",
            swagger_js_url=f"{root}{base}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{base}/swagger-ui.css",
            swagger_favicon_url=f"{root}{base}/favicon.png",
            # No badge from the online validator (an image from the internet).
            swagger_ui_parameters={"validatorUrl": None},
        )
        page.headers["Content-Security-Policy"] = CSP
        return page

    app.add_api_route(DOCS_URL, swagger_ui, methods=["GET"], include_in_schema=False)
    for name, media_type in ASSETS.items():
        app.add_api_route(
            f"{base}/{name}",
            _asset(folder / name, media_type),
            methods=["GET"],
            include_in_schema=False,
        )
    return True


def _asset(path: Path, media_type: str) -> Callable[[], Awaitable[FileResponse]]:
    async def asset() -> FileResponse:
        return FileResponse(path, media_type=media_type, headers=CACHE)

    return asset
