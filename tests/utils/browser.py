"""Headless Chromium for the browser tests: Debian's `chromium` driven by
selenium through Debian's `chromedriver` (never a download of selenium's),
with every address but 127.0.0.1 sent to a closed port."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.utils.processes import wait_ready

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# Seconds, for anything a page does: a check that holds ends the wait at once,
# so this only bounds a page that never gets there, on a loaded machine too.
WAIT = 60

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


class Chromedriver(Service):
    """Debian's chromedriver, its output in `log`, started once its /status
    says it is ready for a session: selenium's own start gives up after a
    fixed number of polls, however busy the machine is."""

    def __init__(self, log: Path) -> None:
        super().__init__(executable_path=str(CHROMEDRIVER), log_output=str(log))
        self.log = log

    def output(self) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"{self.log}:\n{text}"

    def start(self) -> None:
        self._start_process(self.path)
        try:
            wait_ready(
                self.is_connectable,
                self.process,
                self.output,
                f"chromedriver on {self.service_url}",
            )
        except BaseException:
            self.stop()
            raise


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
    with tempfile.TemporaryDirectory(prefix="memchat-chromedriver-") as logs:
        service = Chromedriver(Path(logs) / "chromedriver.log")
        driver = webdriver.Chrome(service=service, options=options)
        try:
            yield driver
        finally:
            driver.quit()


def wait(driver: WebDriver, what: str, check: Any) -> Any:
    """`check(driver)`'s first truthy value, polled for up to WAIT seconds."""
    return WebDriverWait(driver, WAIT, poll_frequency=0.05).until(check, f"waiting for {what}")
