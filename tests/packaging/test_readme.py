"""README's claims name their proof: every test file and test, and every benchmark results file, that README.md or
bench/HISTORY.md (the benchmark's dated entries) names must exist."""

from __future__ import annotations

import re

import pytest

from hack.testbed.process import REPO

DOCS = ("README.md", "bench/HISTORY.md")


@pytest.mark.parametrize("doc", DOCS)
def test_every_test_a_doc_names_exists(doc: str) -> None:
    text = (REPO / doc).read_text()
    named = set(re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", text))
    assert len(named) > 5
    missing = []
    for path, name in sorted(named):
        f = REPO / path
        if not f.is_file():
            missing.append(path)
        elif name and not re.search(rf"^(async )?def {name}\b", f.read_text(), re.M):
            missing.append(f"{path}::{name}")
    assert missing == []


@pytest.mark.parametrize("doc", DOCS)
def test_every_results_file_a_doc_names_exists(doc: str) -> None:
    """Those written out in full (`bench/results/<file>`)."""
    text = (REPO / doc).read_text()
    results = REPO / "bench" / "results"
    named = set(re.findall(r"bench/results/([\w.-]+\.(?:json|png))", text))
    assert named
    assert sorted(n for n in named if not (results / n).is_file()) == []
