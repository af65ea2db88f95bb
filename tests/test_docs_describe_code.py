"""Docs, tests and code speak of the code, not of its history.

A mention of one of this project's own issues (the word issue followed by a number, a
"#" and a number, or a range of numbers) tells a reader why something was once done, not
what the code does: the issue tracker and CHANGELOG.md keep that history. A reference qualified by another project ("optax issue
196", "google/jax issue 123", "issue 5 of flax") is a fact about that project and stays.

Scanned: tests/**/*.py, functrain/**/*.py, docs/**/*.md (not the generated docs/_build and
docs/notebooks), benchmarks/*.py, benchmarks/README.md and README.md. Not scanned:
CHANGELOG.md and benchmarks/results/ (history by nature) and docs/design.md (being
rewritten; to be added).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

NOT_SCANNED: set = set()
NOT_SCANNED_DIRS = ("docs/_build/", "docs/notebooks/")

# Mentions in files whose owners fix them separately: each entry must still match a
# mention (the test says when an entry can go), and nothing else is exempt.
PENDING: set = set()

# The word, singular or plural, any case, then a number, "#" and a number, or a number
# wrapped onto the next line (a comment's "#" allowed), but not a heading or a colon
# followed by a numbered list (the examples at the end of this file).
MENTION = re.compile(r"\bissues?(?:[ \t]*#?[ \t]*\d+|[ \t]*\n[ \t]*#?[ \t]*#?\d+(?![.)]\s))",
                     re.IGNORECASE)

# Projects whose issues may be cited by name (case-insensitive), besides any owner/repo.
OTHER_PROJECTS = {
    "optax", "jax", "jaxlib", "xla", "openxla", "flax", "orbax", "chex", "equinox", "haiku",
    "megatron", "megatron-lm", "numpy", "scipy", "pytorch", "torch", "tensorflow", "keras",
    "bitsandbytes", "psgd-jax", "lightbench", "deepspeed", "transformers", "triton",
}
OWNER_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
FILE_SUFFIXES = (".py", ".md", ".rst", ".json", ".txt", ".toml", ".cfg", ".sh")


def _is_project(word: str) -> bool:
    word = re.sub(r"['\u2019]s$", "", word.strip("()[]`*_,;:\"'"))
    if word.lower() in OTHER_PROJECTS:
        return True
    return bool(OWNER_REPO.match(word)) and not word.lower().endswith(FILE_SUFFIXES)


def _qualified(text: str, start: int, end: int) -> bool:
    """Whether the mention at text[start:end] names another project: the word just before
    "issue" (past "GitHub", and a line break with its comment "#"), or "of"/"in"/"on" and
    a project just after the number."""
    before = re.sub(r"\s*\n\s*#*\s*", " ", text[max(0, start - 80):start])
    words = before.split()
    while words and words[-1].lower() in {"github", "the", "an", "a"}:
        words.pop()
    if words and _is_project(words[-1]):
        return True
    after = re.match(r"[ \t]*(?:[-,][ \t]*\d+[ \t]*)*\s+(?:of|in|on)\s+(?:the\s+)?(\S+)",
                     text[end:end + 80])
    return bool(after) and _is_project(after.group(1))


def own_issue_mentions(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each mention of this project's own issues in text."""
    lines = text.splitlines()
    found = []
    for match in MENTION.finditer(text):
        if not _qualified(text, match.start(), match.end()):
            number = text.count("\n", 0, match.start()) + 1
            found.append((number, lines[number - 1].strip()))
    return found


def scanned_files() -> list[Path]:
    files = list((ROOT / "tests").rglob("*.py")) + list((ROOT / "functrain").rglob("*.py"))
    files += list((ROOT / "docs").rglob("*.md")) + list((ROOT / "benchmarks").glob("*.py"))
    files += [ROOT / "benchmarks" / "README.md", ROOT / "README.md"]
    out = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel in NOT_SCANNED or rel.startswith(NOT_SCANNED_DIRS) or "__pycache__" in rel:
            continue
        out.append(path)
    return sorted(set(out))


def test_no_mentions_of_this_projects_issues() -> None:
    found, pending_seen = [], set()
    for path in scanned_files():
        rel = path.relative_to(ROOT).as_posix()
        for number, line in own_issue_mentions(path.read_text(encoding="utf-8")):
            if (rel, number) in PENDING:
                pending_seen.add((rel, number))
            else:
                found.append(f"{rel}:{number}: {line}")
    assert not found, ("these mention this project's own issues; say what the code does "
                       "instead (the history belongs in CHANGELOG.md):\n" + "\n".join(found))
    stale = sorted(PENDING - pending_seen)
    assert not stale, f"no longer mention an issue, remove them from PENDING: {stale}"


def test_the_scan_covers_the_tree() -> None:
    rels = {p.relative_to(ROOT).as_posix() for p in scanned_files()}
    for expected in ["README.md", "benchmarks/README.md", "docs/performance.md", "docs/design.md",
                     "functrain/__init__.py", "tests/test_docs.py", "benchmarks/run.py",
                     Path(__file__).relative_to(ROOT).as_posix()]:
        assert expected in rels, expected
    assert not any(r.startswith(("benchmarks/results/", "CHANGELOG")) for r in rels)


# The examples spell the word in two string pieces so that this file does not mention
# an issue itself.
W = "iss" "ue"


@pytest.mark.parametrize("text", [
    f"# Same-shape batching ({W} 21): one loop per shape",
    f'"""Tests for functrain.sharding ({W} 6).',
    f"{W.capitalize()} 21's benchmark.",
    f"see {W} #23",
    f"the work of {W}s 31-36",
    f"# wrapped at the end of a comment line, the {W}\n# 23 on the next",
    f"`adamw_fp8` ({W} 23, item 2)",
    f"not the optax cause but our own {W} 12",
])
def test_own_issue_mentions_are_found(text: str) -> None:
    assert own_issue_mentions(text), text


@pytest.mark.parametrize("text", [
    f"steepest-ascent direction (optax {W} 196): conjugate it",
    f"as in optax's {W} 206",
    f"Megatron-LM {W} 1234 describes it",
    f"see google/jax {W} 12345 and jax#12345",
    f"goodfire-ai/spd GitHub {W} 978",
    f"the JAX\n# {W} 4321",
    f"{W} 5 of flax",
    f"https://github.com/google/jax/{W}s/12345",
    f"## Known {W}s\n\n1. none",
    f"Known {W}s:\n1. none",
    f"{W}s that remain",
])
def test_other_projects_issues_and_plain_words_are_allowed(text: str) -> None:
    assert not own_issue_mentions(text), text


def test_a_mention_is_reported_with_its_line() -> None:
    text = f"first line\nsecond, ({W} 23)\nthird"
    assert own_issue_mentions(text) == [(2, f"second, ({W} 23)")]
