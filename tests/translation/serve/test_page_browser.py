"""The page in a real browser: headless Chromium, driven by Selenium through ChromeDriver, types
lines into the page the server serves, presses the button and reads the translations.

Needs Debian's ``chromium`` and ``chromium-driver`` (``apt-get install -y chromium
chromium-driver``) and Selenium (``python3 -m pip install -e ".[browser]"``); skipped, saying
which is missing, without them (CI has no browser: tests/translation/serve/test_server.py
checks the page's HTML and that its script posts to /translate). As a script, it takes the
screenshot in docs/ with a real checkpoint:

    python3 tests/translation/serve/test_page_browser.py --checkpoint CKPT --output docs/serve_page.png
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

if __name__ == "__main__":  # run as a script: the project's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.toy_text import toy_pairs  # noqa: E402
from tests.translation.serve.helpers import (  # noqa: E402
    Server,
    reference_translator,
    require_serve,
    write_toy_checkpoint,
)

require_serve()
webdriver = pytest.importorskip(
    "selenium.webdriver", reason='selenium is not installed (python3 -m pip install -e ".[browser]")'
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
# The flags that keep a headless Chromium off the network and away from the user's profile.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1100,560",
)


def chromium(profile: Path):
    """A headless Chromium with a fresh profile in ``profile``, driven by ChromeDriver."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))


def translate_on_the_page(browser, url: str, text: str, timeout: float = 60.0) -> str:
    """Opens the page, types ``text``, presses Translate and returns what the page shows."""
    browser.get(url + "/")
    wait = WebDriverWait(browser, timeout)
    wait.until(lambda b: b.find_element(By.ID, "model").text not in ("", "…"))  # /health answered
    source = browser.find_element(By.ID, "source")
    source.clear()
    source.send_keys(text)
    browser.find_element(By.ID, "go").click()
    wait.until(lambda b: b.find_element(By.ID, "status").text.endswith(" ms"))
    return browser.find_element(By.ID, "result").text


@pytest.mark.slow
@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs Debian's chromium and chromium-driver")
def test_a_line_typed_into_the_page_comes_back_translated(tmp_path: Path) -> None:
    checkpoint = write_toy_checkpoint(tmp_path / "toy.ckpt")
    lines = [s for s, _ in toy_pairs(3, seed=4)]
    expected = reference_translator(checkpoint).translate(lines, beam_size=5)
    with Server(checkpoint, tmp_path / "server.log") as server:
        browser = chromium(tmp_path / "profile")
        try:
            shown = translate_on_the_page(browser, server.url, "\n".join(lines))
            assert browser.find_element(By.ID, "status").get_attribute("class") != "error"
            assert browser.save_screenshot(str(tmp_path / "page.png"))
        finally:
            browser.quit()
        assert server.health()["lines"] == len(lines)
    assert shown.split("\n") == expected
    assert (tmp_path / "page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def main() -> None:
    parser = argparse.ArgumentParser(description="The page's screenshot, with a real checkpoint.")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--output", default="docs/serve_page.png")
    parser.add_argument(
        "--text",
        default="Ein Hund rennt über eine grüne Wiese.\nZwei Kinder spielen am Strand.\n"
        "Eine Frau mit rotem Hut liest ein Buch im Park.",
    )
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        Server(Path(args.checkpoint), Path(tmp) / "server.log") as server,
    ):
        browser = chromium(Path(tmp) / "profile")
        try:
            print(translate_on_the_page(browser, server.url, args.text))
            browser.save_screenshot(args.output)
        finally:
            browser.quit()
    print(f"screenshot: {args.output}")


if __name__ == "__main__":
    main()
