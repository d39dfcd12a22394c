"""The API docs at /docs of `memchat dev`, offline, in a real browser:
headless Chromium (Debian's package) driven by selenium through Debian's
chromedriver, with every address but 127.0.0.1 sent to a closed port.

Swagger UI's files are served by the app (memchat.api.docs), so the page
renders every operation of /openapi.json with nothing from the internet;
"Authorize" takes a bearer token that "Try it out" then sends.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from memchat.api import docs
from memchat.config import Settings
from tests.utils.api import ApiClient
from tests.utils.browser import chromium, wait
from tests.utils.dev_server import DevServer


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    # The console shows any load the page's Content-Security-Policy refused.
    with chromium() as driver:
        yield driver


def operations(spec: dict[str, Any]) -> list[tuple[str, str]]:
    methods = {"get", "put", "post", "delete", "patch", "options", "head"}
    return [
        (method.upper(), path)
        for path, item in spec["paths"].items()
        for method in item
        if method in methods
    ]


def png_facts(data: bytes) -> tuple[int, int, int]:
    """A PNG's width, height and number of distinct bytes in its pixel rows
    (a blank page has a handful)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    pos, idat, size = 8, b"", (0, 0)
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    return size[0], size[1], len(set(zlib.decompress(idat)))


# ------------------------------------------------------------------ tests


def test_docs_render_offline_and_authorize_sends_the_bearer_token(
    browser: WebDriver, dev: DevServer, tmp_path: Path
) -> None:
    spec = httpx.get(f"{dev.url}/openapi.json", timeout=10).json()
    expected = len(operations(spec))
    assert expected >= 10, operations(spec)

    browser.get(f"{dev.url}/docs")
    wait(
        browser,
        f"Swagger UI to render the {expected} operations",
        lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock")) == expected,
    )
    title = browser.find_element(By.CSS_SELECTOR, ".swagger-ui .info .title").text
    assert "memchat" in title, title
    shown = {
        (
            block.find_element(By.CSS_SELECTOR, ".opblock-summary-method").text,
            block.find_element(By.CSS_SELECTOR, ".opblock-summary-path").get_attribute("data-path"),
        )
        for block in browser.find_elements(By.CSS_SELECTOR, ".opblock")
    }
    assert shown == set(operations(spec))

    shot = tmp_path / "docs.png"
    assert browser.save_screenshot(str(shot))
    width, height, distinct = png_facts(shot.read_bytes())
    viewport = browser.execute_script(
        "return [innerWidth * devicePixelRatio, innerHeight * devicePixelRatio]"
    )
    assert [width, height] == viewport and width >= 800 and height >= 600, (width, height)
    assert shot.stat().st_size > 10_000 and distinct > 50, (shot.stat().st_size, distinct)

    # Everything the page loaded came from the app.
    loaded = browser.execute_script(
        "return performance.getEntriesByType('resource').map((e) => e.name)"
    )
    assert any(url.endswith("/swagger-ui-bundle.js") for url in loaded), loaded
    assert any(url.endswith("/openapi.json") for url in loaded), loaded
    assert all(url.startswith(f"{dev.url}/") for url in loaded), loaded

    # Authorize: the bearer scheme's dialog, then the token goes with "Try it out".
    authorize = browser.find_element(By.CSS_SELECTOR, ".auth-wrapper .btn.authorize")
    assert "unlocked" in authorize.get_attribute("class")
    authorize.click()
    dialog = wait(
        browser,
        "the Authorize dialog",
        lambda d: next(iter(d.find_elements(By.CSS_SELECTOR, ".dialog-ux .modal-ux")), None),
    )
    text = dialog.text
    assert "SupabaseAccessToken" in text and "http, Bearer" in text, text
    token = dev.token()
    dialog.find_element(By.CSS_SELECTOR, "input").send_keys(token)
    dialog.find_element(By.CSS_SELECTOR, ".auth-btn-wrapper .authorize").click()
    wait(browser, "the dialog to say so", lambda d: "Authorized" in dialog.text)
    dialog.find_element(By.CSS_SELECTOR, ".auth-btn-wrapper .btn-done").click()
    wait(
        browser,
        "the Authorize button to lock",
        lambda d: (
            "locked"
            in d.find_element(By.CSS_SELECTOR, ".auth-wrapper .btn.authorize")
            .get_attribute("class")
            .split()
        ),
    )

    memory = browser.find_element(
        By.XPATH,
        "//div[contains(@class, 'opblock-get')]"
        "[.//*[contains(@class, 'opblock-summary-path') and @data-path='/memory']]",
    )
    memory.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
    wait(browser, "Try it out", lambda d: memory.find_elements(By.CSS_SELECTOR, ".try-out__btn"))
    memory.find_element(By.CSS_SELECTOR, ".try-out__btn").click()
    wait(browser, "Execute", lambda d: memory.find_elements(By.CSS_SELECTOR, ".btn.execute"))
    memory.find_element(By.CSS_SELECTOR, ".btn.execute").click()
    status = wait(
        browser,
        "the live response",
        lambda d: next(
            iter(
                memory.find_elements(
                    By.CSS_SELECTOR, ".live-responses-table tr.response .response-col_status"
                )
            ),
            None,
        ),
    )
    assert status.text.strip() == "200", memory.text
    curl = memory.find_element(By.CSS_SELECTOR, ".curl-command").text
    assert f"Authorization: Bearer {token}" in curl, curl
    body = memory.find_element(
        By.CSS_SELECTOR, ".live-responses-table tr.response .response-col_description"
    )
    assert '"agent_name": "default"' in body.text, body.text

    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def test_the_page_refers_only_to_its_own_origin(dev: DevServer) -> None:
    r = httpx.get(f"{dev.url}/docs", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert "://" not in html, html  # no CDN, no absolute URL of any kind
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "connect-src 'self'" in csp, csp
    urls = re.findall(r"""(?:src|href)="([^"]*)"|url: '([^']*)'""", html)
    refs = [a or b for a, b in urls]
    assert len(refs) == 4, refs  # the CSS, the favicon, the script, the document
    assert all(ref.startswith("/") and not ref.startswith("//") for ref in refs), refs
    assert "/openapi.json" in refs
    for ref in refs:
        asset = httpx.get(f"{dev.url}{ref}", timeout=10)
        assert asset.status_code == 200 and asset.content, (ref, asset.status_code)
    kinds = {ref.rsplit(".", 1)[-1]: ref for ref in refs}
    for ext, media_type in (("js", "text/javascript"), ("css", "text/css"), ("png", "image/png")):
        served = httpx.get(f"{dev.url}{kinds[ext]}", timeout=10).headers["content-type"]
        assert served.startswith(media_type), (ext, served)
    # FastAPI's own ReDoc page would load from a CDN: not served.
    assert httpx.get(f"{dev.url}/redoc", timeout=10).status_code == 404


async def test_without_the_assets_there_is_no_docs_page_but_the_document_stays(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As deployed (fastapi-offline is in the `dev` extra only)."""
    assert docs.swagger_ui_dir() is not None  # the test extra has it
    monkeypatch.setattr(docs, "swagger_ui_dir", lambda: None)
    api = ApiClient(settings)
    try:
        for path in ("/docs", "/redoc"):
            r = await api.get(path)
            assert r.status_code == 404 and r.json()["error"] == "not_found", (path, r.text)
        r = await api.get("/openapi.json")
        assert r.status_code == 200
        assert r.json()["components"]["securitySchemes"]["SupabaseAccessToken"]["scheme"] == (
            "bearer"
        )
    finally:
        await api.aclose()
