"""The built site in a real browser: headless Debian Chromium, driven by Selenium.

Run by ``nox -s docs`` (not collected by the default test run: the file name does not start
with ``test_``). It opens the site as the README says it is: from the folder it is built in,
``DOMO_SITE_DIR`` (default build/site), by ``file://`` URLs, with no server. Every page loads,
each image renders (naturalWidth > 0), the console has no errors, every internal link points
at a file (not a folder, which a browser would show as a listing), and search finds pages.
Screenshots of the pages listed in tests/docs/site_check.toml go to build/site-check/.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import tomllib
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("DOMO_SITE_DIR", ROOT / "build" / "site"))
OUT = ROOT / "build" / "site-check"
CONFIG = tomllib.loads((Path(__file__).parent / "site_check.toml").read_text())
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
]


@pytest.fixture(scope="module")
def site() -> str:
    """The site's folder as a file:// URL, as a reader opens it after ``nox -s docs``."""
    assert (SITE / "index.html").is_file(), f"build the site first (mkdocs build): {SITE}"
    return SITE.resolve().as_uri() + "/"


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="domo-chromium-")
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The Debian driver, named explicitly, so Selenium Manager never downloads one.
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def site_pages() -> list[str]:
    return sorted(str(p.relative_to(SITE)) for p in SITE.rglob("*.html") if p.name != "404.html")


def check_page(driver: webdriver.Chrome, url: str) -> list[str]:
    """Open ``url``; return what is wrong with it (empty when nothing is)."""
    driver.get_log("browser")  # type: ignore[no-untyped-call,unused-ignore]  # drop earlier logs
    driver.get(url)
    problems = []
    if not driver.title:
        problems.append("no title")
    broken = driver.execute_script(
        "return Array.from(document.images)"
        ".filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)"
    )
    problems += [f"image does not render: {src}" for src in broken]
    problems += [
        f"console: {entry['message']}"
        for entry in driver.get_log("browser")  # type: ignore[no-untyped-call,unused-ignore]
        if entry["level"] == "SEVERE"
    ]
    return problems


def internal_links(driver: webdriver.Chrome, base: str) -> set[str]:
    hrefs: list[str] = driver.execute_script(
        "return Array.from(document.querySelectorAll('a[href]')).map(a => a.href)"
    )
    return {urllib.parse.urldefrag(h).url for h in hrefs if h.startswith(base)}


def test_every_page_loads_renders_and_links_resolve(browser: webdriver.Chrome, site: str) -> None:
    pages = site_pages()
    assert "index.html" in pages
    assert len(pages) >= 10, pages
    problems: dict[str, list[str]] = {}
    links: set[str] = set()
    for page in pages:
        found = check_page(browser, site + page)
        if found:
            problems[page] = found
        links |= internal_links(browser, site)
    for link in sorted(links):
        target = Path(urllib.request.url2pathname(urllib.parse.urlparse(link).path))
        if not target.is_file():  # a folder would open as a listing of its files
            what = "a folder" if target.is_dir() else "missing"
            problems.setdefault("links", []).append(f"{link}: {what}")
    assert problems == {}
    assert len(links) > len(pages)  # the nav links every page from every page


def test_search_finds_pages_without_a_server(browser: webdriver.Chrome, site: str) -> None:
    """The search box works from the folder: a word from the tutorials finds their pages."""
    browser.get(site + "index.html")
    box = WebDriverWait(browser, 10).until(
        expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, "input.md-search__input"))
    )
    box.click()  # as a reader does: opening search is what loads its index (from a file here)
    box.send_keys("heartbeat")
    results = WebDriverWait(browser, 20).until(
        lambda driver: driver.find_elements(By.CSS_SELECTOR, ".md-search-result__item a")
    )
    hrefs = [result.get_attribute("href") or "" for result in results]
    assert len(hrefs) >= 3, hrefs
    for href in hrefs:
        page = Path(urllib.request.url2pathname(urllib.parse.urlparse(href).path))
        assert page.is_file(), href


def test_screenshots_of_configured_pages(browser: webdriver.Chrome, site: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    targets = [(site + page, page) for page in CONFIG["screenshots"]]
    targets += [((ROOT / path).resolve().as_uri(), path) for path in CONFIG["html"]]
    for url, name in targets:
        assert check_page(browser, url) == [], name
        shot = OUT / (name.replace("/", "_").removesuffix(".html") + ".png")
        assert browser.save_screenshot(str(shot)), shot
        assert shot.stat().st_size > 1000, shot
