"""The site builds with ``--strict`` (and a broken link is shown to break it), renders offline, and names
only files that exist."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

from tests.docs.conftest import ROOT, Build, mkdocs_build

DOCS = ROOT / "docs"
MERMAID = DOCS / "assets" / "vendor" / "mermaid"
LEAD_MARKER = "<!-- lead: check against the merged code"
MADE_BY_RUNS = ("bench/results/",)  # written by `make bench`, not committed


def _nav_pages() -> list[str]:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:\n", 1)[1]
    return re.findall(r"([\w/-]+\.md)\s*$", nav, re.M)


def test_the_site_builds_strict(built_site: Build) -> None:
    assert built_site.returncode == 0, built_site.output
    for page in _nav_pages():
        html = built_site.site / ("index.html" if page == "index.md" else page.removesuffix("index.md").removesuffix(".md"))
        html = html / "index.html" if html.suffix != ".html" else html
        assert html.is_file(), f"{page} was not built"
    api = (built_site.site / "reference" / "python-api" / "index.html").read_text(encoding="utf-8")
    assert 'id="pgpoll.reader.read_changes"' in api  # mkdocstrings rendered the docstrings
    cli = (built_site.site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert 'id="pgpoll-ingest"' in cli and "--batch-changes" in cli


def test_every_page_is_in_the_navigation() -> None:
    listed = set(_nav_pages())
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "snippets" not in p.parts}
    assert pages == listed


def test_a_broken_link_or_an_orphan_page_fails_the_strict_build(tmp_path: Path) -> None:
    """The validation settings of mkdocs.yml turn each of these into a failure (the real config, inherited)."""
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs, ignore=shutil.ignore_patterns("__pycache__"))
    with (docs / "index.md").open("a", encoding="utf-8") as page:
        page.write("\n[gone](no-such-page.md) and [no anchor](concepts/slots-and-lsns.md#no-such-heading)\n")
    (docs / "orphan.md").write_text("# Not in the navigation\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"INHERIT: {ROOT / 'mkdocs.yml'}\ndocs_dir: {docs}\n")
    broken = mkdocs_build(config, tmp_path / "site")
    assert broken.returncode != 0
    assert "no-such-page.md" in broken.output
    assert "no-such-heading" in broken.output
    assert "orphan.md" in broken.output


def test_the_built_site_loads_nothing_from_the_internet(built_site: Build) -> None:
    """No script, stylesheet or font from another host (no CDN, no web fonts): the site renders offline.
    (test_render.py checks what a browser actually requests.)"""
    external = re.compile(r"<(?:script|link|img)\b[^>]*\b(?:src|href)=\"(?:https?:)?//", re.I)
    for html in built_site.site.rglob("*.html"):
        found = [m.group(0) for m in external.finditer(html.read_text(encoding="utf-8"))
                 if 'rel="canonical"' not in m.group(0)]
        assert not found, f"{html.relative_to(built_site.site)} loads from the network: {found}"
    assert (built_site.site / "assets" / "vendor" / "mermaid" / "mermaid.min.js").is_file()


def test_the_vendored_mermaid_is_the_one_its_version_file_names() -> None:
    fields = dict(line.split(": ", 1) for line in (MERMAID / "VERSION").read_text().splitlines())
    digest = hashlib.sha256((MERMAID / "mermaid.min.js").read_bytes()).hexdigest()
    assert digest == fields["sha256"], "mermaid.min.js changed: re-vendor it with `make vendor-mermaid`"
    assert fields["version"].split(".")[0] == "11", "Material's Mermaid integration is written for Mermaid 11"
    assert "MIT" in (MERMAID / "LICENSE").read_text()
    config = (ROOT / "mkdocs.yml").read_text()
    assert "- assets/vendor/mermaid/mermaid.min.js" in config
    # Material fetches Mermaid from a CDN only when no global `mermaid` exists: the vendored file defines it
    assert (MERMAID / "mermaid.min.js").read_bytes().rstrip().endswith(b'globalThis["mermaid"] = '
                                                                       b'globalThis.__esbuild_esm_mermaid_nm["mermaid"].default;')


def test_every_repository_path_the_docs_name_exists() -> None:
    """`pgpoll/...`, `tests/...`, `sql/...` and the like in the text must exist; pages marked for the lead
    describe branches not merged yet and are left out."""
    path = re.compile(r"`((?:pgpoll|tests|jobs|bench|sql|docs)/[\w./-]*\w)/?`")
    missing = []
    for page in DOCS.rglob("*.md"):
        text = page.read_text(encoding="utf-8")
        if LEAD_MARKER in text or "snippets" in page.parts:
            continue
        missing += [f"{page.relative_to(DOCS)}: {p}" for p in path.findall(text)
                    if "*" not in p and "<" not in p and not p.startswith(MADE_BY_RUNS) and not (ROOT / p).exists()]
    assert not missing, missing
