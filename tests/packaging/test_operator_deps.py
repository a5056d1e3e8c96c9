"""The operator's image leaves out the writer's heavy dependencies (the Dockerfile's list): every operator
module imports, and a sink renders, with those packages unimportable."""

from __future__ import annotations

import re
import subprocess
import sys

from hack.testbed.process import REPO

_PROBE = """
import importlib, pkgutil, sys
blocked = set(sys.argv[1].split(","))

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError(f"{name} is not in the operator's image")
        return None

sys.meta_path.insert(0, Block())
import sinkoperator
for m in pkgutil.walk_packages(sinkoperator.__path__, "sinkoperator."):
    importlib.import_module(m.name)
import yaml
from sinkoperator.model import SinkSpec
from sinkoperator.render import render
sample = yaml.safe_load(open("tests/operator/sample.yaml"))
cm, app = render("default", "orders", SinkSpec.parse(sample["spec"]), "")
assert app["kind"] == "SparkApplication", app
print("ok", sorted(m for m in sys.modules if m.split(".")[0] in blocked))
"""


def _left_out() -> list[str]:
    """The distributions the Dockerfile's operator stage leaves out, as import names."""
    m = re.search(r"grep -vE '\^\(([^)]*)\)==' /dist/requirements\.txt[^>]*>\s*/dist/requirements-operator\.txt",
                  (REPO / "Dockerfile").read_text())
    assert m, "the Dockerfile no longer builds requirements-operator.txt from an exclusion list"
    imported_as = {"grpcio": "grpc", "grpcio-tools": "grpc_tools"}
    return [imported_as.get(d, d.replace("-", "_")) for d in m.group(1).split("|")]


def test_the_operator_imports_and_renders_without_the_writers_dependencies() -> None:
    left_out = _left_out()
    assert {"pyspark", "chdb", "pyarrow", "pandas", "grpc_tools"} <= set(left_out)
    res = subprocess.run([sys.executable, "-c", _PROBE, ",".join(left_out)], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok []", res.stdout + res.stderr
