"""The import contract of the layers: each package may import only the layers below it.

    core      <- formats <- config <- edges <- delivery <- spark (the only one importing pyspark)
    sinkoperator: config, core and edges only (never the writer, the runtime or Spark)

Every import counts, including those inside functions, so a lazy import cannot hide a dependency. bench/ and
hack/ (benchmark, demo, test bed) may use anything but tests/.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hack.testbed.process import REPO

# what each sparkapp module family may import from sparkapp (besides itself)
ALLOWED = {
    "sparkapp.core": set(),
    "sparkapp.formats": {"sparkapp.core"},
    "sparkapp.config": {"sparkapp.core", "sparkapp.formats"},
    "sparkapp.edges": {"sparkapp.core", "sparkapp.formats", "sparkapp.config"},
    "sparkapp.delivery": {"sparkapp.core", "sparkapp.formats", "sparkapp.config", "sparkapp.edges"},
    "sparkapp.spark": {"sparkapp.core", "sparkapp.formats", "sparkapp.config", "sparkapp.edges", "sparkapp.delivery",
                       "sparkapp.metrics"},
    "sinkoperator": {"sparkapp.core", "sparkapp.config", "sparkapp.edges"},
}
# the operator's decisions (the lifecycle, the models, the names, rebalance plans) are pure like the core
PURE_OPERATOR = {"sinkoperator.lifecycle", "sinkoperator.model", "sinkoperator.spec", "sinkoperator.rebalance"}
# the core decides, it does not act: no network, files, processes, clocks or randomness
IO_MODULES = {"os", "io", "socket", "subprocess", "urllib", "http", "pathlib", "shutil", "time", "random", "uuid",
              "datetime", "threading", "clickhouse_connect", "chdb", "confluent_kafka", "kopf", "kubernetes",
              "pyspark", "prometheus_client", "requests", "logging"}


def _family(module: str) -> str | None:
    return next((f for f in sorted(ALLOWED, key=len, reverse=True) if module == f or module.startswith(f + ".")),
                None)


def _modules() -> list[tuple[str, Path]]:
    out = []
    for top in ("sparkapp", "sinkoperator", "bench", "hack"):
        for path in sorted((REPO / top).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            out.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return out


def _imports(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, relative ones resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` imports pkg.mod when mod is a module
            out += [(node.lineno, f"{base}.{a.name}" if (REPO / Path(*base.split("."), f"{a.name}.py")).exists()
                     else base) for a in node.names]
    return out


MODULES = _modules()


def violations(module: str, path: Path) -> list[str]:
    family = _family(module)
    found = []
    for line, imported in _imports(module, path):
        where = f"{path.relative_to(REPO)}:{line} imports {imported}"
        top = imported.split(".")[0]
        product = module.split(".")[0] in ("sparkapp", "sinkoperator")
        if top == "pyspark" and product and not module.startswith("sparkapp.spark"):
            found.append(f"{where}: only sparkapp.spark may import pyspark")
        if top == "tests" and not module.startswith("tests"):
            found.append(f"{where}: the product, bench and hack never import tests")
        if family == "sparkapp.core" and top in IO_MODULES:
            found.append(f"{where}: the core does no IO")
        if module in PURE_OPERATOR and (top in IO_MODULES or imported.startswith("sparkapp.edges")):
            found.append(f"{where}: the operator's decisions do no IO")
        if family is None or top not in ("sparkapp", "sinkoperator"):
            continue
        target = _family(imported) or imported
        if target == family or (family == "sinkoperator" and top == "sinkoperator"):
            continue
        if target not in ALLOWED[family]:
            found.append(f"{where}: {family} may import only {sorted(ALLOWED[family]) or 'itself'}")
    return found


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_imports_follow_the_layers(module: str, path: Path) -> None:
    assert violations(module, path) == []


def test_the_contract_catches_a_core_module_doing_io_or_reaching_up(tmp_path: Path) -> None:
    bad = REPO / "sparkapp" / "core" / "_contract_probe.py"
    bad.write_text("import socket\nfrom ..edges.store import StateStore\n\n\ndef f():\n    import pyspark\n")
    try:
        found = violations("sparkapp.core._contract_probe", bad)
    finally:
        bad.unlink()
    assert any("the core does no IO" in v for v in found)
    assert any("sparkapp.edges" in v and "may import only" in v for v in found)
    assert any("only sparkapp.spark may import pyspark" in v for v in found)


def cycles(modules: list[tuple[str, Path]]) -> list[list[str]]:
    """The circles of imports among `modules` (lazy ones included), each as its members: the strongly connected
    components of more than one module (Tarjan)."""
    names = {m for m, _ in modules}
    graph = {m: sorted({i for _, i in _imports(m, p) if i in names and i != m}) for m, p in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        for n in graph[m]:
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            members = []
            while (n := stack.pop()) != m:
                members.append(n)
            if members:
                out.append(sorted([m, *members]))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return out


def test_no_module_of_the_product_imports_one_that_imports_it_back() -> None:
    """A batch's path reads top to bottom inside a layer too: a circle (even through a lazy import) means two
    modules each decide part of the other's work."""
    assert cycles([(m, p) for m, p in MODULES if m.split(".")[0] in ("sparkapp", "sinkoperator")]) == []


def test_the_circle_check_finds_a_lazy_circle() -> None:
    a, b = (REPO / "sparkapp" / "edges" / f"_circle_probe_{n}.py" for n in "ab")
    a.write_text("from . import _circle_probe_b\n")
    b.write_text("def f():\n    from ._circle_probe_a import g\n")
    try:
        found = cycles([("sparkapp.edges._circle_probe_a", a), ("sparkapp.edges._circle_probe_b", b),
                        ("sparkapp.edges.errors", REPO / "sparkapp" / "edges" / "errors.py")])
    finally:
        a.unlink()
        b.unlink()
    assert found == [["sparkapp.edges._circle_probe_a", "sparkapp.edges._circle_probe_b"]]
