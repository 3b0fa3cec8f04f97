"""Every link to a section of the docs lands on a heading (GitHub's anchors), so an
index by task or a "see design.md#..." never points at a section renamed since."""

from __future__ import annotations

import re

from tests.conftest import ROOT

HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)
LINK = re.compile(r"\]\(([A-Za-z0-9_./-]*\.md)?#([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path) -> set[str]:
    return {anchor(h) for h in HEADING.findall(path.read_text())}


def test_every_link_to_a_section_lands_on_a_heading():
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target, fragment in LINK.findall(page.read_text()):
            linked = (page.parent / target).resolve() if target else page
            if linked.exists() and fragment not in anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target}#{fragment}")
    assert broken == []
