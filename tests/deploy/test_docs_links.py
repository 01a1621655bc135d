"""The docs point at files that exist, and each ADR's heading carries its file's number."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DOCS = (
    "README.md",
    "docs/**/*.md",
    "libs/*/README.md",
    "services/*/README.md",
    "libs/*/src/**/*.md",
    "helm/*/README.md",
)

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^\"']*[\"'])?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]\n]+\]:\s*<?([^\s>]+)>?", re.M)
INLINE_CODE_MD = re.compile(r"`([\w./-]+\.md)`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
ADR_FILE = re.compile(r"^(\d{4})-[a-z0-9-]+\.md$")
ADR_HEADING = re.compile(r"^# (\d{4}) — \S")


def markdown_files(root: Path = ROOT) -> list[Path]:
    found = {path for pattern in DOCS for path in root.glob(pattern) if path.is_file()}
    return sorted(path for path in found if ".venv" not in path.parts)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", text)):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """Relative links (and `*.md` names in inline code) in `path` that lead nowhere."""
    text = path.read_text()
    prose = FENCE.sub("", text)
    problems = []
    for target in [*LINK.findall(prose), *REFERENCE.findall(prose)]:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            problems.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved.read_text()):
            problems.append(f"{target}: no heading #{fragment}")
    for name in INLINE_CODE_MD.findall(prose):
        if not ((path.parent / name).exists() or (root / name).exists()):
            problems.append(f"`{name}`: no such file (beside it or from the repository root)")
    return problems


def adr_number_problems(path: Path) -> list[str]:
    match = ADR_FILE.match(path.name)
    if match is None:
        return [f"{path.name}: an ADR is named NNNN-lower-case-title.md"]
    first = next((line for line in path.read_text().splitlines() if line.startswith("#")), "")
    heading = ADR_HEADING.match(first)
    if heading is None:
        return [f"{path.name}: the first heading {first!r} is not '# {match[1]} — Title'"]
    if heading[1] != match[1]:
        return [f"{path.name}: the heading says {heading[1]}, the file name {match[1]}"]
    return []


def adrs(root: Path = ROOT) -> list[Path]:
    return sorted((root / "docs" / "adr").glob("*.md"))


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file(path: Path) -> None:
    assert broken_links(path) == []


@pytest.mark.parametrize("path", adrs(), ids=lambda p: p.name)
def test_each_adr_heading_carries_its_file_number(path: Path) -> None:
    assert adr_number_problems(path) == []


def test_no_two_adrs_share_a_number() -> None:
    numbers = [path.name[:4] for path in adrs()]
    assert len(numbers) == len(set(numbers)), sorted(numbers)


def test_the_docs_are_found() -> None:
    found = {str(path.relative_to(ROOT)) for path in markdown_files()}
    assert {"README.md", "docs/benchmarks.md", "docs/adr/0001-messaging-outbox-inbox.md"} <= found
    assert len(adrs()) >= 9


# -- the checks themselves fail on broken docs ----------------------------------------------------------
def test_a_missing_file_a_missing_heading_and_a_missing_md_name_are_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("# There\n\n## Some Section: here\n")
    doc = tmp_path / "README.md"
    doc.write_text(
        "[ok](docs/there.md) [ok](docs/there.md#some-section-here) [ok](#top) [ok](https://x.org/a.md)\n"
        "[gone](docs/gone.md) [bad anchor](docs/there.md#nowhere) see `BENCHMARKS.md`, `docs/there.md`\n"
        "[ref]: docs/also-gone.md\n\n# Top\n\n```\n[in code](not/checked.md)\n```\n"
    )
    assert broken_links(doc, tmp_path) == [
        "docs/gone.md: no such file",
        "docs/there.md#nowhere: no heading #nowhere",
        "docs/also-gone.md: no such file",
        "`BENCHMARKS.md`: no such file (beside it or from the repository root)",
    ]


def test_an_adr_whose_heading_has_another_number_is_reported(tmp_path: Path) -> None:
    adr = tmp_path / "0009-scheduler-service.md"
    adr.write_text("# 0007 — The scheduler service\n\nStatus: accepted\n")
    assert adr_number_problems(adr) == [
        "0009-scheduler-service.md: the heading says 0007, the file name 0009"
    ]
    adr.write_text("# ADR 0009: the scheduler service\n")
    assert adr_number_problems(adr) != []
    adr.write_text("# 0009 — The scheduler service\n")
    assert adr_number_problems(adr) == []
