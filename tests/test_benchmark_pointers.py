"""Docstrings, comments, --help and configs point to BENCHMARKS.md sections that exist.

They give no timings of their own (those drift); they name the section that measures what they
claim, e.g. ``(BENCHMARKS.md, "Decoding speed")``. A renamed or removed section fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = {"runs", "tests", ".git", ".venv", "node_modules"}


def _sources() -> list[Path]:
    files = [*ROOT.glob("*.py"), *ROOT.glob("*/**/*.py"), *ROOT.glob("conf/**/*.yaml")]
    return sorted(p for p in files if not SKIP & set(p.relative_to(ROOT).parts))


def _anchors() -> set[str]:
    """Section headings (without the ``(command, date)`` that follows) and bold paragraph leads."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    headings = re.findall(r"^#+ (.+)$", text, flags=re.M)
    bold = re.findall(r"\*\*([^*]+)\*\*", text)
    return {h.split(" (")[0].strip() for h in headings} | {b.rstrip(".").strip() for b in bold}


def pointed_sections(text: str) -> list[str]:
    """The capitalised quoted names in the 160 characters after each "BENCHMARKS.md", once each."""
    flat = re.sub(r"\n\s*#?\s*", " ", text)  # one line; comment markers of wrapped comments dropped
    names = []
    for match in re.finditer(r"BENCHMARKS\.md", flat):
        window = flat[match.end() : match.end() + 160]
        names += [m.group(2) for m in re.finditer(r"([\"'])([A-Z][^\"']{3,80})\1", window)]
    return list(dict.fromkeys(names))


def test_pointers_find_names_in_wrapped_text():
    text = "x (BENCHMARKS.md, \"Found while\n    # profiling\") and\nBENCHMARKS.md, 'Decoding speed'"
    assert pointed_sections(text) == ["Found while profiling", "Decoding speed"]


def test_every_pointer_names_a_section_that_exists():
    anchors = _anchors()
    pointers = {
        (path.relative_to(ROOT), name) for path in _sources() for name in pointed_sections(path.read_text())
    }
    assert len(pointers) >= 8  # the pointers are found at all
    missing = sorted((str(path), name) for path, name in pointers if name not in anchors)
    assert not missing, f"BENCHMARKS.md has no section of these names: {missing}"
