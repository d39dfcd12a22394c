"""Headless Chromium for the browser tests: Debian's `chromium` driven by
selenium through Debian's `chromedriver` (never a download of selenium's),
with every address but 127.0.0.1 sent to a closed port."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT = 30  # seconds, for anything a page does

ARGUMENTS = (
    "--headless=new",
    "--no-sandbox",  # CI runs as root
    "--disable-dev-shm-usage",
    "--window-size=1200,900",
    # Nothing but the test's own server on 127.0.0.1: no background services,
    # and anything else goes to a closed loopback port (loopback bypasses it).
    "--proxy-server=http://127.0.0.1:9",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-client-side-phishing-detection",
    "--disable-domain-reliability",
    "--no-default-browser-check",
    "--no-first-run",
    "--no-pings",
    "--dns-prefetch-disable",
)


@contextmanager
def chromium(downloads: Path | None = None) -> Iterator[WebDriver]:
    """A headless Chromium, quit afterwards; downloads go to `downloads`, and
    the browser console is kept (`driver.get_log("browser")`). A missing
    browser fails the test: it never skips."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
    assert not missing, (
        f"{', '.join(missing)} missing: the browser tests need Debian's Chromium"
        " (sudo apt-get install chromium chromium-driver; infra/test.sh installs them as root)"
    )
    options = Options()
    options.binary_location = str(CHROMIUM)
    for argument in ARGUMENTS:
        options.add_argument(argument)
    if downloads is not None:
        options.add_experimental_option(
            "prefs",
            {
                "download.default_directory": str(downloads),
                "download.prompt_for_download": False,
                "download.directory_upgrade": True,
                "safebrowsing.enabled": False,
            },
        )
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver: WebDriver, what: str, check: Any) -> Any:
    """`check(driver)`'s first truthy value, polled for up to WAIT seconds."""
    return WebDriverWait(driver, WAIT, poll_frequency=0.05).until(check, f"waiting for {what}")
