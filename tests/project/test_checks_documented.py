"""Every system check id the code can raise is documented: the policies' and the
deployment's in docs/design.md's *System checks*, a setting's beside it in
docs/settings.md, the product's in docs/settings.md too."""

from __future__ import annotations

import re

from tests.conftest import ROOT

CHECK_ID = re.compile(r"\b(?:cleanup|reservations)\.[EW]\d{3}\b")


def ids_in(paths) -> set[str]:
    return {found for path in paths for found in CHECK_ID.findall(path.read_text())}


def test_every_check_id_in_the_code_is_in_the_docs():
    in_code = ids_in(p for folder in ("cleanup", "reservations")
                     for p in (ROOT / folder).rglob("*.py") if "migrations" not in p.parts)
    design = (ROOT / "docs/design.md").read_text()
    checks_section = design.split("## System checks", 1)[1].split("\n## ", 1)[0]
    documented = set(CHECK_ID.findall(checks_section)) | ids_in([ROOT / "docs/settings.md"])

    assert len(in_code) >= 48  # 43 of the engine's and 5 of the product's, at least
    assert sorted(in_code - documented) == []
