"""README's claims name their tests: every named test file and test must exist."""

from __future__ import annotations

import re

from hack.testbed.process import REPO


def test_every_test_the_readme_names_exists():
    text = (REPO / "README.md").read_text()
    named = set(re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", text))
    assert len(named) > 20
    missing = []
    for path, name in sorted(named):
        f = REPO / path
        if not f.is_file():
            missing.append(path)
        elif name and not re.search(rf"^(async )?def {name}\b", f.read_text(), re.M):
            missing.append(f"{path}::{name}")
    assert missing == []
