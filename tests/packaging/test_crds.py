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


def _walk(node: dict[str, Any], path: str = "spec") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, node)]
    for key, child in (node.get("properties") or {}).items():
        out += _walk(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict) and node["items"].get("properties"):
        out += _walk(node["items"], f"{path}[]")
    return out


def test_every_spec_field_is_described_for_kubectl_explain() -> None:
    missing = [p for p, node in _walk(_spec_schema()) if not node.get("description") and not p.endswith("[]")]
    assert missing == [], f"fields without a description (kubectl explain shows <no description>): {missing}"


@pytest.mark.parametrize("file", ["chsink.io_clickhousesinks.yaml", "chsink.io_sinkstatuses.yaml"])
def test_every_field_of_both_kinds_is_described_for_kubectl_explain(file: str) -> None:
    """Status too (`kubectl explain sinkstatus.status.partitions` was empty), and the chart's copy is the same."""
    text = (REPO / "crds" / file).read_text()
    assert (REPO / "charts" / "chsink" / "crds" / file).read_text() == text
    root = yaml.safe_load(text)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    # The API server refuses anything beside `type` on the root's metadata ("must not specify anything
    # other than name and generateName"), so it is the one field left undescribed.
    assert root["properties"]["metadata"] == {"type": "object"}
    kind = file.split("_")[1].split(".")[0]
    missing = [p for p, node in _walk(root, kind)
               if not node.get("description") and not p.endswith("[]") and p != f"{kind}.metadata"]
    assert missing == [], f"fields without a description (kubectl explain shows <no description>): {missing}"


def test_the_crd_and_the_operator_model_have_the_same_fields() -> None:
    from pydantic import BaseModel

    from sinkoperator.model import SinkSpec

    def fields(model: type[BaseModel], path: str) -> set[str]:
        out = set()
        for name, f in model.model_fields.items():
            key = f"{path}.{f.alias or name}"
            out.add(key)
            ann = f.annotation
            for t in (getattr(ann, "__args__", None) or (ann,)):
                t = getattr(t, "__args__", (t,))[0] if getattr(t, "__origin__", None) is list else t
                if isinstance(t, type) and issubclass(t, BaseModel) and t.__module__ in ("sinkoperator.model", "sinkoperator.podspec"):
                    out |= fields(t, key)
        return out

    from sinkoperator.podspec import KUBERNETES_TYPED

    # below a Kubernetes-typed field the CRD has core/v1's schema and the model passes it through whole
    crd = {p.replace("[]", "") for p, _ in _walk(_spec_schema()) if p != "spec"
           and not any(f".{k}." in p.replace("[]", "") for k in KUBERNETES_TYPED)}
    model = fields(SinkSpec, "spec")
    # sections the job's own models hold (format, batching, dlq): their first level is the CRD's
    assert model <= crd, f"in the model, not the CRD: {sorted(model - crd)}"
    shallow = {p for p in crd - model if p.count(".") > 2 or p.split(".")[1] not in ("format", "batching", "dlq")}
    assert shallow == set(), f"in the CRD, not the model: {sorted(shallow)}"


def test_the_crd_checks_durations_as_the_job_does() -> None:
    from sparkapp.config import TRIGGER_INTERVAL

    node = _spec_schema()["properties"]["batching"]["properties"]["triggerInterval"]
    assert node["pattern"] == TRIGGER_INTERVAL.pattern


def test_the_pod_templates_kubernetes_types_are_core_v1s_as_the_spark_operator_has_them() -> None:
    """tolerations, affinity and both security contexts are checked by the API server with Kubernetes' own schemas
    (the spark-operator's CRD carries core/v1's, generated from its Go types), not free-form: only the top-level
    description is chsink's."""
    from hack.testbed.process import cache_dir, versions
    from sinkoperator.podspec import KUBERNETES_TYPED

    path = cache_dir() / f"spark-operator-{versions()['SPARK_OPERATOR_VERSION']}" / "chart" / "crds"
    theirs = yaml.safe_load((path / "sparkoperator.k8s.io_sparkapplications.yaml").read_text())
    [v1beta2] = [v for v in theirs["spec"]["versions"] if v["name"] == "v1beta2"]
    upstream = v1beta2["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    spark = _spec_schema()["properties"]["spark"]["properties"]
    for role in ("driver", "executor"):
        for key in KUBERNETES_TYPED:
            ours = {k: v for k, v in spark[role]["properties"][key].items() if k != "description"}
            assert ours == {k: v for k, v in upstream[role]["properties"][key].items() if k != "description"}, (role, key)
