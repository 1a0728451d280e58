"""THREAT_MODEL.md stays readable and every row stays linked to its test.

The file is one table per adversary (Attack | Status | Defence | Test). These checks keep it under
4,000 words, keep each row's status in the file's own legend, make every row that claims a defence
name a test, make every `tests/...` reference resolve to a test that exists, and make every
section or row that the code cites by name still be there. No network, no engine: text only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "THREAT_MODEL.md"
MAX_WORDS = 4000
HEADER = ["Attack", "Status", "Defence", "Test"]
NOT_DEFENDED = "not defended"
CODE_DIRS = ("gentorrent", "user_client", "model_node", "verifier", "testkit", "tests", "devnet", "bench",
             "sims", "fuzz")

#: tests/FILE.py, tests/FILE.py::NAME, tests/FILE.py::NAME[PARAM], tests/FILE.py::...[PARAM]
TEST_REF = re.compile(r"tests/(?P<file>\w+)\.py(?:::(?:\.\.\.\[(?P<any>[^\]\s`]+)\]|(?P<name>\w+)"
                      r"(?:\[(?P<param>[^\]\s`]+)\])?))?")
#: a reference that does not name its file: `::test_x`, `::...[x]`, or `test_x.py` without `tests/`
ORPHAN_REF = re.compile(r"(?<!\.py)::(?:test_|\.\.\.\[)|(?<![\w/])test_\w+\.py")
#: THREAT_MODEL.md "Name", THREAT_MODEL.md ("Name"), (THREAT_MODEL.md, "Name")
CITE = re.compile(r'THREAT_MODEL\.md,?\s*\(?"([^"]+)"')
SEPARATOR = re.compile(r"\|(?:\s*:?-+:?\s*\|)+\s*")
STATUS = re.compile(r"\*\*(?P<status>[^*]+)\*\*(?: \((?P<qualifier>.+)\))?")
LEGEND = re.compile(r"^- \*\*(?P<status>[^*]+)\*\*:", re.M)
HEADING = re.compile(r"^#+\s+(?P<title>.+?)\s*$", re.M)
LABEL = re.compile(r"\*(?P<label>[^*]+)\*")


def doc_text(path: Path = DOC) -> str:
    return path.read_text(encoding="utf-8")


def word_count(text: str) -> int:
    """Words as `wc -w` counts them: runs of non-whitespace."""
    return len(text.split())


def cells(line: str) -> list[str]:
    """The cells of a table line, split on unescaped pipes."""
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", inner)]


def table_rows(text: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) of every table row that is neither a header nor a separator."""
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("|") and not SEPARATOR.fullmatch(line) and cells(line) != HEADER:
            yield number, cells(line)


def statuses(text: str) -> set[str]:
    """The statuses the file's legend ("## Statuses", one `- **status**: meaning` per line) allows."""
    section = text.split("## Statuses", 1)[1].split("\n## ", 1)[0] if "## Statuses" in text else ""
    return {m["status"] for m in LEGEND.finditer(section)}


def row_problems(text: str) -> list[str]:
    allowed = statuses(text)
    problems = [] if NOT_DEFENDED in allowed else [f"the legend has no '{NOT_DEFENDED}': {sorted(allowed)}"]
    for number, row in table_rows(text):
        if len(row) != len(HEADER):
            problems.append(f"line {number}: {len(row)} cells, not {len(HEADER)}")
            continue
        status = STATUS.fullmatch(row[1])
        if status is None or status["status"] not in allowed:
            problems.append(f"line {number}: status {row[1]!r} is not **one of {sorted(allowed)}** (qualifier)")
        elif status["status"] != NOT_DEFENDED and not TEST_REF.search(row[3]):
            problems.append(f"line {number}: {status['status']!r} but no tests/... reference in {row[3]!r}")
    return problems


def defines(source: str, name: str) -> bool:
    return re.search(rf"^\s*(?:async\s+)?def {re.escape(name)}\(", source, re.M) is not None


def reference_problems(text: str, root: Path = ROOT) -> list[str]:
    problems = [f"{m.group(0)!r} does not name its file as tests/<file>.py" for m in ORPHAN_REF.finditer(text)]
    for ref in TEST_REF.finditer(text):
        path = root / "tests" / f"{ref['file']}.py"
        if not path.is_file():
            problems.append(f"{ref.group(0)}: no such file")
            continue
        source = path.read_text(encoding="utf-8")
        if ref["name"] and not defines(source, ref["name"]):
            problems.append(f"{ref.group(0)}: {path.name} defines no {ref['name']}")
        for param in (ref["any"], ref["param"]):
            if param and param not in source:
                problems.append(f"{ref.group(0)}: {param!r} appears nowhere in {path.name}")
    return problems


def cited_names(root: Path = ROOT) -> dict[str, list[str]]:
    """Name -> the .py files that cite THREAT_MODEL.md by it (this file excluded: it cites nothing)."""
    cited: dict[str, list[str]] = {}
    for top in CODE_DIRS:
        for path in sorted((root / top).rglob("*.py")):
            if ".venv" in path.parts or "__pycache__" in path.parts or path.resolve() == Path(__file__).resolve():
                continue
            for name in CITE.findall(path.read_text(encoding="utf-8", errors="replace")):
                cited.setdefault(name, []).append(str(path.relative_to(root)))
    return cited


def anchors(text: str) -> set[str]:
    """What a citation may name: a heading (with or without its trailing parenthesis) or a row's
    label, the first *italic* words of its Attack cell."""
    found: set[str] = set()
    for heading in HEADING.finditer(text):
        title = heading["title"]
        found |= {title, re.sub(r"\s*\([^()]*\)$", "", title)}
    for _, row in table_rows(text):
        label = LABEL.search(row[0]) if row else None
        if label:
            found.add(label["label"])
    return found


def citation_problems(text: str, root: Path = ROOT) -> list[str]:
    known = anchors(text)
    return [f"{name!r}, cited by {', '.join(files)}, is no heading or row label of THREAT_MODEL.md"
            for name, files in sorted(cited_names(root).items()) if name not in known]


# --------------------------------------------------------------------------- the file itself


def test_the_threat_model_stays_under_4000_words() -> None:
    """The issue's bar for a file people actually read: under 4,000 words (`wc -w`)."""
    assert word_count(doc_text()) < MAX_WORDS


def test_every_row_has_four_cells_a_status_of_the_legend_and_a_test_unless_not_defended() -> None:
    """Each row says attack, status, defence and test; a claimed defence without a test is a claim
    nobody checks, so only 'not defended' rows may go without one."""
    assert row_problems(doc_text()) == []


def test_every_test_reference_resolves_to_a_test_that_exists() -> None:
    """A renamed or deleted test must not leave its row pointing at nothing."""
    assert reference_problems(doc_text()) == []


def test_every_section_or_row_the_code_cites_is_still_there() -> None:
    """Code comments send readers to THREAT_MODEL.md by section or row name; a rewrite that drops
    or renames one breaks those pointers."""
    cited = cited_names()
    assert {"The anonymous path", "Registry and TLS", "Model groups"} <= set(cited)
    assert citation_problems(doc_text()) == []


# --------------------------------------------------------------------------- the checks can fail

GOOD = """# Model

## Statuses

- **defended**: a test fails without it.
- **not defended**: the gap.

## Relays (anyone)

| Attack | Status | Defence | Test |
|---|---|---|---|
| *Tagging* | **defended** (bounded) | MACs | `tests/test_x.py::test_real`, `tests/test_x.py::...[mode-a]` |
| *Timing* | **not defended** | none | — |
"""

BROKEN = {
    "three cells": GOOD.replace("| *Timing* | **not defended** | none | — |", "| *Timing* | none | — |"),
    "unknown status": GOOD.replace("**not defended** | none", "**mostly fine** | none"),
    "defended without a test": GOOD.replace("**not defended** | none", "**defended** | none"),
    "missing test": GOOD.replace("test_x.py::test_real", "test_x.py::test_renamed"),
    "missing file": GOOD.replace("tests/test_x.py::test_real", "tests/test_gone.py::test_real"),
    "missing param": GOOD.replace("[mode-a]", "[mode-z]"),
    "orphan reference": GOOD.replace("`tests/test_x.py::...[mode-a]`", "`::test_real`"),
    "missing heading": GOOD.replace("## Relays (anyone)", "## Paths"),
}


def _mini_repo(root: Path) -> None:
    (root / "tests").mkdir()
    (root / "tests" / "test_x.py").write_text(
        '@pytest.mark.parametrize("mode", ["mode-a"])\nasync def test_real(mode):\n    pass\n')
    (root / "gentorrent").mkdir()
    (root / "gentorrent" / "mod.py").write_text('# see THREAT_MODEL.md, "Relays"; (THREAT_MODEL.md, "Tagging")\n')


def _all_problems(text: str, root: Path) -> list[str]:
    return row_problems(text) + reference_problems(text, root) + citation_problems(text, root)


def test_a_sound_doc_passes_every_check(tmp_path: Path) -> None:
    _mini_repo(tmp_path)
    assert _all_problems(GOOD, tmp_path) == []
    assert word_count(GOOD) < MAX_WORDS <= word_count("word " * MAX_WORDS)


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_check_catches_its_breakage(tmp_path: Path, case: str) -> None:
    """Each check must be able to fail, or it guards nothing."""
    _mini_repo(tmp_path)
    assert _all_problems(BROKEN[case], tmp_path) != []
