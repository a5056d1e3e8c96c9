"""The docs' claims name their proof: every test file and test, and every benchmark results file, that README.md,
a page of docs/ or bench/HISTORY.md (the benchmark's dated entries) names must exist."""

from __future__ import annotations

import re

import pytest

from hack.testbed.process import REPO

DOCS = ("README.md", "bench/HISTORY.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md")))


def test_the_docs_are_the_readme_history_and_every_page_of_the_site():
    assert {"README.md", "bench/HISTORY.md", "docs/index.md", "docs/operator.md", "docs/testbed.md",
            "docs/exactly-once.md", "docs/performance.md", "docs/reference/crd.md"} <= set(DOCS)


def test_the_readme_is_the_front_door_not_the_manual():
    assert len((REPO / "README.md").read_text().splitlines()) <= 300


@pytest.mark.parametrize("doc", DOCS)
def test_every_test_a_doc_names_exists(doc: str) -> None:
    text = (REPO / doc).read_text()
    named = set(re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", text))
    missing = []
    for path, name in sorted(named):
        f = REPO / path
        if not f.is_file():
            missing.append(path)
        elif name and not re.search(rf"^(async )?def {name}\b", f.read_text(), re.M):
            missing.append(f"{path}::{name}")
    assert missing == []


def test_the_readme_names_the_tests_of_its_claims() -> None:
    assert len(set(re.findall(r"tests/[\w/]+\.py", (REPO / "README.md").read_text()))) > 5


@pytest.mark.parametrize("doc", DOCS)
def test_every_results_file_a_doc_names_exists(doc: str) -> None:
    """Those written out in full (`bench/results/<file>`)."""
    text = (REPO / doc).read_text()
    results = REPO / "bench" / "results"
    named = set(re.findall(r"bench/results/([\w.-]+\.(?:json|png))", text))
    assert sorted(n for n in named if not (results / n).is_file()) == []


def test_the_performance_page_and_the_history_name_their_results() -> None:
    for doc in ("docs/performance.md", "bench/HISTORY.md"):
        assert re.search(r"bench/results/[\w.-]+\.json", (REPO / doc).read_text()), doc
