"""The documentation site: built by MkDocs with --strict, every page opened in headless Chromium
(it loads, every figure shows), no broken internal link or anchor; the README stays a landing page.

The pages' code blocks run in tests/test_docs.py; here the site itself is checked as a reader
meets it, served over HTTP from the build folder.
"""

import functools
import http.server
import os
import re
import subprocess
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import pytest

from conftest import IMAGE_PROBE, run_chromium

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200


def test_the_readme_is_a_landing_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; the site holds the details"
    for page in re.findall(r"\]\((docs/[^)#]+\.md)", "\n".join(lines)):
        assert (ROOT / page).is_file(), f"README links to {page}, which does not exist"


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert pages and [p for p in pages if f" {p}" not in nav] == []


class _Links(HTMLParser):
    """The hrefs, image sources and element ids of one page."""

    def __init__(self):
        super().__init__()
        self.links, self.images, self.ids = [], [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        if tag == "img" and attrs.get("src"):
            self.images.append(attrs["src"])


def _parse(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built into a temporary folder with ``mkdocs build --strict``, as ``make docs`` does."""
    try:
        import mkdocs  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("mkdocs is not installed; requirements-dev.txt (make test) installs it")
        pytest.skip("mkdocs is not installed (requirements-dev.txt)")
    out = tmp_path_factory.mktemp("site") / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-f",
                           str(ROOT / "mkdocs.yml"), "-d", str(out)], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"), timeout=600)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-3000:]}"
    return out


def _pages(site: Path):
    return sorted(p for p in site.glob("*.html") if p.name != "404.html")


@pytest.mark.slow
def test_no_internal_link_or_anchor_is_broken(site):
    pages = _pages(site)
    names = {p.stem for p in (ROOT / "docs").glob("*.md")}
    assert {p.stem for p in pages} == names  # a page per Markdown file
    parsed = {p: _parse(p) for p in pages}
    broken = []
    for page, found in parsed.items():
        for ref in found.links + found.images:
            url = urlparse(ref)
            if url.scheme or ref.startswith("//") or ref.startswith("mailto:"):
                continue  # outside the site
            target = (page.parent / unquote(url.path)).resolve() if url.path else page
            if not target.exists():
                broken.append(f"{page.name}: {ref} (no file)")
            elif url.fragment and target.suffix == ".html":
                ids = parsed[target].ids if target in parsed else _parse(target).ids
                if unquote(url.fragment) not in ids:
                    broken.append(f"{page.name}: {ref} (no such anchor)")
    assert broken == []


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(site):
    """The site over HTTP on localhost (as a reader's browser gets it): its base URL."""
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.mark.slow
@pytest.mark.full
def test_every_page_loads_in_chromium_with_every_figure(site, served, tmp_path):
    """Each page, with a probe added to a copy of it, opened in headless Chromium: the page's own
    title, and every image decoded (naturalWidth > 0)."""
    shown = 0
    for page in _pages(site):
        text = page.read_text(encoding="utf-8")
        title = re.search(r"<title>([^<]*)</title>", text).group(1)
        probe = page.with_name(f"probe-{page.name}")
        probe.write_text(text.replace("</body>", IMAGE_PROBE + "</body>"), encoding="utf-8")
        try:
            dom = run_chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", urljoin(served, probe.name))
        finally:
            probe.unlink()
        assert f"<title>{title}</title>" in dom, f"{page.name} did not load"
        found = re.search(r'data-image-widths="([^"]*)"', dom)
        assert found, f"{page.name} never finished loading"
        widths = [int(w) for w in found.group(1).split(",") if w]
        assert all(w > 0 for w in widths), f"{page.name}: images that did not load (natural widths {widths})"
        shown += len(widths)
    figures = sum(len(re.findall(r"!\[[^\]]*\]\(", p.read_text())) for p in (ROOT / "docs").glob("*.md"))
    assert figures > 0 and shown == figures  # every figure of the Markdown reached the browser
