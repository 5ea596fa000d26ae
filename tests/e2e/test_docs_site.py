"""The built docs site as a reader opens it: from disk (``file://``, as the README says),
with every link going to a page a browser shows, and wide reference tables that fit.

The site is built strictly, as ``make docs`` builds it; the pages are read in a real
headless Chromium (Debian's ``chromium``, driven by Playwright).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e.test_console import CHROMIUM_ARGS
from tests.infra import ensure_program

REPO = Path(__file__).resolve().parents[2]
WAIT_MS = 30_000
# Files a page loads besides pages: styles, scripts, images, the search index, OpenAPI.
ASSETS = re.compile(r"\.(css|js|png|svg|ico|json|xml|gz|woff2?)$")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    mkdocs = Path(sys.executable).with_name("mkdocs")
    subprocess.run(
        [str(mkdocs), "build", "--strict", "--quiet", "--site-dir", str(folder)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=True,
        timeout=300,
    )
    return folder


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self.loaded: list[str] = []  # what the page loads by itself: scripts, styles, images

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value for name, value in attrs if value}
        if tag == "a" and "href" in values:
            self.found.append(str(values["href"]))
        elif tag in ("script", "img") and "src" in values:
            self.loaded.append(str(values["src"]))
        elif tag == "link" and values.get("rel") in ("stylesheet", "icon"):
            self.loaded.append(str(values.get("href", "")))


def test_every_link_of_the_built_site_goes_to_a_file(site: Path) -> None:
    """From file:// a link to a folder shows a directory listing: every internal link of
    every page names an existing .html file (or an asset)."""
    # 404.html is served by a web server for any path: its links are absolute on purpose.
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")
    assert len(pages) > 30
    checked = 0
    for page in pages:
        parser = _Links()
        parser.feed(page.read_text("utf-8"))
        for href in parser.found:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or not parts.path:
                continue  # another site, mailto:, or an anchor on this page
            target = (page.parent / parts.path).resolve()
            where = f"{page.relative_to(site)}: {href}"
            assert target.is_file(), f"{where} is not a file"
            assert target.suffix == ".html" or ASSETS.search(target.name), where
            checked += 1
        # Read offline and behind firewalls: a page loads nothing from another host.
        assert [src for src in parser.loaded if urlsplit(src).netloc] == [], page
    assert checked > 1000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    program = ensure_program("chromium", "chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=program, args=CHROMIUM_ARGS, headless=True
        )
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    opened = context.new_page()
    opened.set_default_timeout(WAIT_MS)
    yield opened
    context.close()


def test_the_site_reads_from_disk(site: Path, page: Any) -> None:
    page.goto((site / "index.html").as_uri())
    page.locator(".md-nav__link", has_text="Getting started").first.click()
    page.wait_for_url("**/getting-started.html")
    assert page.locator("h1").first.inner_text().startswith("Getting started")
    page.locator(".md-content a[href='reference/settings.html']").first.click()
    page.wait_for_url("**/reference/settings.html")
    assert page.locator("td code", has_text="AGENTSTATE_DATABASE_URL").count() >= 1


FITS = """() => [...document.querySelectorAll('.md-typeset table')].map(table => {
    const frame = table.closest('.md-typeset__scrollwrap') || table.parentElement;
    const cells = [...table.querySelectorAll('td:not(:last-child) code')];
    return {
        overflow: Math.max(
            frame.scrollWidth - frame.clientWidth, table.scrollWidth - table.clientWidth),
        broken: cells.filter(code => code.getClientRects().length > 1).map(c => c.textContent),
    };
})"""


@pytest.mark.parametrize("width", [1280, 1024])
@pytest.mark.parametrize("name", ["settings", "errors"])
def test_wide_reference_tables_fit_and_keep_values_whole(
    site: Path, browser: Any, name: str, width: int
) -> None:
    context = browser.new_context(viewport={"width": width, "height": 800})
    try:
        page = context.new_page()
        page.goto((site / "reference" / f"{name}.html").as_uri())
        (table,) = page.evaluate(FITS)
        assert table["overflow"] <= 1, f"{name}.html at {width}px: clipped by {table['overflow']}px"
        assert table["broken"] == [], f"{name}.html at {width}px: values wrapped mid-way"
    finally:
        context.close()
