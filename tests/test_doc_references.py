"""Design decisions are cited from the repository's ``docs/``, never from documents outside it.

Code, tests, examples and the OpenAPI text once cited design notes that were not in the
repository ("Part B item 6", "design b.1", "service-design c.2", section signs): a reader could
not follow them. Every such citation now names a page and section of ``docs/``
(``docs/service.md#claim-and-lease``); public standards are cited by name and section number
(``RFC 9110 section 13``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# how the old citations looked: never again, anywhere in the tracked text files
OUTSIDE = re.compile(
    r"Part B|design b\.|design c\.|service-design|method doc|comera-method|§|\bb\.[0-9]|\bc\.[0-9]"
)
DOC_LINK = re.compile(r"docs/([\w.-]+\.md)(?:#([\w-]+))?")
THIS = Path(__file__).resolve().relative_to(ROOT)


def _tracked_text_files() -> list[Path]:
    """Every file git tracks (untracked work in progress included), binaries left out."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.split(b"\0")
    out = []
    for name in filter(None, listed):
        path = ROOT / name.decode()
        if path.is_file() and Path(name.decode()) != THIS and b"\0" not in path.read_bytes()[:8192]:
            out.append(path)
    return out


def test_no_citation_of_a_document_outside_the_repository():
    hits = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in _tracked_text_files()
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not hits, "cite docs/<page>.md#<section> instead:\n" + "\n".join(hits)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: links reduced to their text, lower case,
    punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {
        _anchor(line.lstrip("#"))
        for line in page.read_text().splitlines()
        if re.match(r"#{1,6} ", line)
    }


def test_every_docs_citation_names_a_page_and_section_that_exist():
    missing = []
    for path in _tracked_text_files():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for page, anchor in DOC_LINK.findall(line):
                target = ROOT / "docs" / page
                if not target.is_file() or (anchor and anchor not in _anchors(target)):
                    missing.append(f"{path.relative_to(ROOT)}:{n}: docs/{page}#{anchor}")
    assert not missing, "citations of missing pages or sections:\n" + "\n".join(missing)


def test_the_patterns_catch_the_old_citations():
    for old in (
        "Part B item 6",
        "design b.1",
        "service-design c.2",
        "(b.6)",
        "c.4",
        "RFC 9110 §13",
    ):
        assert OUTSIDE.search(old), old
    assert not OUTSIDE.search("docs/service.md#claim-and-lease, RFC 9110 section 13, abc.5")
    assert _anchor("Claim and lease") == "claim-and-lease"
    assert _anchor("[method.md](method.md): the CoMERA method in `engine/`") == (
        "methodmd-the-comera-method-in-engine"
    )
