"""The CRD's enums are the code's enums: each list of names is defined once in Python, and the CRD (which
kubectl and the API server read) must say the same."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from hack.testbed.process import REPO
from sinkoperator.spec import DesiredState
from sparkapp.config import Engine
from sparkapp.core.routing import HashName, Policy
from sparkapp.formats.registry import NAMES as FORMAT_NAMES


def _spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load((REPO / "crds" / "chsink.io_clickhousesinks.yaml").read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def _at(path: str) -> list[str]:
    node = _spec_schema()
    for part in path.split("."):
        node = node["properties"][part]
    return list(node["enum"])


@pytest.mark.parametrize(("path", "names"), [
    ("format.type", list(FORMAT_NAMES)),
    ("sharding.policy", [p.value for p in Policy]),
    ("sharding.hash", [h.value for h in HashName]),
    ("exactlyOnce.engine", [e.value for e in Engine]),
    ("state", [s.value for s in DesiredState]),
])
def test_crd_enum_is_the_code_enum(path: str, names: list[str]) -> None:
    assert _at(path) == names, f"spec.{path} in the CRD differs from the code's names"
