"""The benchmark harnesses (`python -m bench`, `bench.formats`, `bench.writer`, `bench.variants`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def publish(results: dict[str, Any], out: str, name: str) -> int:
    """Writes one harness's results as <out>/<date>-<name>.json and prints them."""
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{results['date']}-{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0
