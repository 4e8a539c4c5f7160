"""The project's own docs: a README a newcomer reads in five minutes that is also a valid Hugging
Face Space card, and every relative link in the README, docs/, the model cards and
benchmarks/RESULTS.md leading to a file (and heading) that exists, so a section moved out of the
README stays reachable; and every section a citation names (`docs/trace.md §3.2`) a numbered heading
of that page, so a renumbered doc cannot leave the code pointing at the wrong place."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOC_PAGES = sorted((ROOT / "docs").glob("*.md"))
MODEL_CARDS = sorted((ROOT / "assets").glob("*/README.md"))
RESULTS = ROOT / "benchmarks" / "RESULTS.md"  # where the docs send every measurement
README_MAX_LINES = 200
# What the Hub accepts in a Space card (huggingface.co/docs/hub/spaces-config-reference).
SPACE_COLOURS = {"red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray"}
SHORT_DESCRIPTION_MAX = 60

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`[^`]*`")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
# Section citations, `docs/trace.md §3.2`: the numbered headings (`## 2. Header`, `### 3.2 ...`) they
# point at, and where code, docs and cards cite one.
NUMBERED_HEADING = re.compile(r"^#{2,6}\s+(\d+(?:\.\d+)*)\.?\s")
NUMBER = r"\d+(?:\.\d+)?(?![.\d]*\d)"
SECTION = re.compile(rf"§({NUMBER})")
# A doc named (`docs/x.md`, `x.md`, `[x.md](x.md)`), then, across spaces and `#` comment markers,
# either a run of sections (`§4.2-4.4`, `§2.4, §2.5 and §2.6`) or a parenthesis holding them
# (`(§3.1)`, `(collect §1, the file §2)`).
CITATION = re.compile(rf"(?<![\w/.-])(?:docs/)?(?P<doc>[a-z_]+)\.md(?:\]\([^)\s]*\))?\)?[\s#]*"
                      rf"(?:(?P<run>§{NUMBER}(?:\s*[-–]\s*§?{NUMBER}|(?:\s*,\s*|[\s#]+(?:and|or)[\s#]+)§{NUMBER})*)"
                      rf"|\((?P<inside>[^()]*§[^()]*)\))")
CITING = sorted({*(ROOT / "engine").rglob("*.py"), *(ROOT / "dinfer_viz").rglob("*.py"), *(ROOT / "tinymodel").rglob("*.py"),
                 *(ROOT / "benchmarks").rglob("*.py"), *(ROOT / "tests").rglob("*.py"), ROOT / "app.py",
                 README, *DOC_PAGES, *MODEL_CARDS, RESULTS} - {Path(__file__).resolve()})


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks: a `#` comment in a shell block is not a heading."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text lower-cased, punctuation but hyphens and
    underscores dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a page, with GitHub's -1, -2 ... for repeated headings."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose(page.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if match:
            base = anchor(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    """The targets of a page's relative links and images (code spans and blocks left out)."""
    targets = []
    for line in prose(page.read_text(encoding="utf-8")):
        targets += [t for t in LINK.findall(CODE_SPAN.sub("", line)) if not SCHEME.match(t)]
    return targets


def broken_links(page: Path) -> list[str]:
    """Each relative link of `page` whose file, or whose heading after `#`, does not exist."""
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            broken.append(f"{target}: no such heading")
    return broken


def sections(page: Path) -> set[str]:
    """The section numbers of a doc page's numbered headings: `## 2. Header` is 2, `### 3.2 ...` 3.2."""
    return {match.group(1) for line in prose(page.read_text(encoding="utf-8")) if (match := NUMBERED_HEADING.match(line))}


def wrong_citations(text: str, docs: Path, own: str | None = None) -> list[str]:
    """`line: citation` for each section cited in `text` that the cited page of `docs` lacks. A
    citation names its page (`docs/trace.md §3.2`, `trace.md (§3.1)`); a bare `§N` is the
    page's own when `text` is the page `own`, and unchecked elsewhere (code says whose it means)."""
    wrong, cited = [], set()
    numbers: dict[str, set[str]] = {}

    def check(doc: str, number: str, at: int, quoted: str) -> None:
        if doc not in numbers:
            page = docs / f"{doc}.md"
            numbers[doc] = sections(page) if page.is_file() else set()
        if number not in numbers[doc]:
            wrong.append(f"{text.count(chr(10), 0, at) + 1}: {quoted} (docs/{doc}.md has no §{number})")

    for match in CITATION.finditer(text):
        part = "run" if match.group("run") else "inside"
        found = re.findall(NUMBER, match.group(part)) if part == "run" else SECTION.findall(match.group(part))
        quoted = " ".join(match.group(0).replace("#", " ").split())
        for number in found:
            check(match.group("doc"), number, match.start(part), quoted)
        cited.update(m.start() + match.start(part) for m in SECTION.finditer(match.group(part)))
    if own:
        for match in SECTION.finditer(text):
            if match.start() not in cited:
                check(own, match.group(1), match.start(), match.group(0))
    return wrong


def front_matter() -> dict:
    text = README.read_text(encoding="utf-8")
    assert text.startswith("---\n"), "README.md must open with the Space card's YAML front matter"
    return yaml.safe_load(text[4:].split("\n---\n", 1)[0])


def test_readme_reads_in_five_minutes():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail to docs/"


def test_front_matter_is_a_valid_space_card():
    card = front_matter()
    assert card["title"] and isinstance(card["title"], str)
    assert card["sdk"] == "gradio"
    assert card["app_file"] == "app.py" and (ROOT / card["app_file"]).is_file()
    assert {card["colorFrom"], card["colorTo"]} <= SPACE_COLOURS
    assert isinstance(card["pinned"], bool)
    assert len(card["short_description"]) <= SHORT_DESCRIPTION_MAX
    # The Space installs the sdk_version named here: it must be one requirements.txt allows.
    pins = [line for line in (ROOT / "requirements.txt").read_text().splitlines() if re.match(r"gradio[<>=!~ ]", line)]
    assert len(pins) == 1, pins
    assert Version(str(card["sdk_version"])) in SpecifierSet(pins[0][len("gradio"):].split("#")[0].strip())


def test_readme_keeps_setup_and_the_two_commands():
    text = README.read_text(encoding="utf-8")
    setup = text.split("## Setup and the two commands", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    for line in ("pip install torch==2.13.0", "--index-url https://download.pytorch.org/whl/cpu",
                 "pip install -r requirements.txt", "pip install -e . --no-deps", "python app.py ", "python -m pytest -q "):
        assert line in setup, line
    # CI runs exactly the README's test command.
    assert (ROOT / ".ci" / "run").read_text().rstrip().splitlines()[-1] == "python -m pytest -q"
    assert "![" in text and "assets/screenshot.png" in links(README)


@pytest.mark.parametrize("page", [README, *DOC_PAGES, *MODEL_CARDS, RESULTS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_every_doc_page_is_linked_from_the_readme():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in links(README)}
    assert DOC_PAGES, "docs/ holds no page"
    assert [str(p.relative_to(ROOT)) for p in DOC_PAGES if p.resolve() not in linked] == []


def test_app_guide_links_the_lesson_screenshots():
    shots = sorted(p.name for p in (ROOT / "docs").glob("lesson-*.png"))
    assert shots and sorted(t for t in links(ROOT / "docs" / "app.md") if t.startswith("lesson-")) == shots


def test_the_checker_finds_a_broken_link_and_a_missing_heading(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n\n## 2. Tensor parallelism: `--tp`\n\n```bash\n# not a heading\n```\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#2-tensor-parallelism---tp) [gone](missing.md) [no](a.md#not-a-heading) "
                    "[self](#local) `[code](nowhere.md)` [web](https://example.org)\n\n## Local\n")
    assert broken_links(page) == ["missing.md: no such file", "a.md#not-a-heading: no such heading"]


@pytest.mark.parametrize("path", CITING, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_section_citation_names_a_section_that_exists(path):
    own = path.stem if path.parent == ROOT / "docs" else None
    wrong = wrong_citations(path.read_text(encoding="utf-8"), ROOT / "docs", own)
    assert not wrong, "".join(f"\n{path.relative_to(ROOT)}:{line}" for line in wrong)


def test_the_citation_checker_finds_a_missing_section(tmp_path):
    (tmp_path / "trace.md").write_text("# T\n\n## 2. Header\n\n```\n## 9. not a heading\n```\n\n## 3. Records\n\n### 3.2 Uniform\n")
    assert sections(tmp_path / "trace.md") == {"2", "3", "3.2"}
    code = ('"""Uniform-state runs (docs/trace.md §3.2) and their header: trace.md §2.\n'
            'Records: docs/trace.md\n    # §3, §2.2 and §9; [trace.md](trace.md) (the header §2, a record §3.1)."""\n'
            '# docs/trace.md §2.1-3.2, docs/nowhere.md §1; bare §7 is unchecked in code\n')
    assert wrong_citations(code, tmp_path) == [
        "3: docs/trace.md §3, §2.2 and §9 (docs/trace.md has no §2.2)",
        "3: docs/trace.md §3, §2.2 and §9 (docs/trace.md has no §9)",
        "3: trace.md](trace.md) (the header §2, a record §3.1) (docs/trace.md has no §3.1)",
        "4: docs/trace.md §2.1-3.2 (docs/trace.md has no §2.1)",
        "4: docs/nowhere.md §1 (docs/nowhere.md has no §1)"]
    assert wrong_citations("As §3.2 says, and §4 does not.\n", tmp_path, own="trace") == ["1: §4 (docs/trace.md has no §4)"]
