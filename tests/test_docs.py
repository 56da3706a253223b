"""The docs stay true to the code: the configuration reference is regenerated, the README is a front page whose
links resolve, and no page speaks of internal issue numbers."""
from __future__ import annotations

import re
from pathlib import Path

from asyncrl.core.config_doc import PAGE, REGENERATE, reference_markdown

ROOT = Path(__file__).resolve().parents[1]
ISSUE = re.compile(r"issues? ?#?[0-9]", re.I)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def user_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_configuration_reference_is_up_to_date():
    assert PAGE.read_text() == reference_markdown(), f"docs/configuration.md is stale: run `{REGENERATE}`"


def test_reference_has_every_key_once():
    text = reference_markdown()
    assert text.count("| `model.path` |") == 1 and "| `learner.lora.rank` |" in text


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the rest belongs in docs/"


def test_no_page_names_an_issue_number():
    found = [f"{page.relative_to(ROOT)}:{n}: {line.strip()}" for page in user_pages()
             for n, line in enumerate(page.read_text().splitlines(), 1) if ISSUE.search(line)]
    assert not found, "user-facing text names internal issue numbers:\n" + "\n".join(found)


def test_readme_relative_links_resolve():
    text = (ROOT / "README.md").read_text()
    targets = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    assert targets, "README.md links to no docs page"
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
