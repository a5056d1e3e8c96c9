"""README's install commands, run as written with helm and kubectl on an empty cluster (a new user's view):
scoped and cluster-wide, a retry of the helm line, and a missing watched namespace refused before anything is
created."""

from __future__ import annotations

import os
import re
import subprocess

from hack.testbed.process import REPO, cached, versions
from hack.testbed.servers import KubeApiServer

SET_LINE = re.compile(r"^\s*--set 'watchNamespaces=\{data\}'.*$", re.M)


def readme_blocks() -> list[str]:
    """The code blocks of README's operator quick start."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Quick start: the operator"):]
    section = section[:section.index("\n## ", 3)]
    return [b + "\n" for b in re.findall(r"^```\n(.*?)\n```", section, re.M | re.S)]


def readme_install_block() -> str:
    return next(b for b in readme_blocks() if b.startswith("kubectl create namespace data"))


def test_the_readme_spark_operator_line_watches_the_sinks_namespace_at_a_version_with_suspend():
    """The spark-operator's install line, rendered by its own chart at the version it names: the controller and
    the webhook watch `data`, and that version's CRD has spec.suspend."""
    block = readme_blocks()[0]
    line = " ".join(block.replace("\\\n", " ").splitlines()[1].split())
    assert line.startswith("helm upgrade --install spark-operator spark-operator/spark-operator"), block
    version = re.search(r"--version (\S+)", line)
    assert version and f"v{version.group(1)}" == versions()["SPARK_OPERATOR_VERSION"], line
    sets = re.findall(r"--set '([^']+)'", line)
    assert sets == ["spark.jobNamespaces={data}"], line
    helm = cached(f"helm-{versions()['HELM_VERSION']}") / "bin" / "helm"
    chart = cached(f"spark-operator-{versions()['SPARK_OPERATOR_VERSION']}") / "chart"
    out = subprocess.run([str(helm), "template", "spark-operator", str(chart), "-n", "spark-operator",
                          *[a for s in sets for a in ("--set", s)]], capture_output=True, text=True, check=True).stdout
    assert "--namespaces=data" in out and "kubernetes.io/metadata.name" in out, out[:2000]
    crd = cached(f"spark-operator-crds-{versions()['SPARK_OPERATOR_VERSION']}") / \
        "sparkoperator.k8s.io_sparkapplications.yaml"
    assert "suspend:" in crd.read_text()


def sh(api: KubeApiServer, script: str) -> subprocess.CompletedProcess[str]:
    """The script in bash from the repository root, with the test bed's helm and kubectl first on PATH."""
    path = os.pathsep.join([str(cached(f"helm-{versions()['HELM_VERSION']}") / "bin"), str(api.bindir),
                            os.environ["PATH"]])
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PATH=path, KUBECONFIG=str(api.kubeconfig)))


def test_the_readme_install_commands_run_as_written(empty_cluster):
    block = readme_install_block()
    lines = block.splitlines()
    assert lines[0].startswith("kubectl create namespace data") and "helm upgrade --install" in lines[1], block
    helm_line = "\n".join(lines[1:3]) + "\n"
    with empty_cluster("readme") as api:
        def ok(script: str) -> str:
            res = sh(api, script)
            assert res.returncode == 0, f"{script}\n{res.stdout}\n{res.stderr}"
            return res.stdout

        missing = sh(api, helm_line)  # the helm line before the namespace exists
        assert missing.returncode != 0
        assert 'watchNamespaces: namespace "data" does not exist; create it first' in missing.stderr, missing.stderr
        assert ok("helm list -a -q -n chsink-system").strip() == "", "a failed release was left behind"

        ok(block)
        assert "deployed" in ok("helm status chsink -n chsink-system")
        assert ok("kubectl get serviceaccount chsink-spark -n data -o name") == "serviceaccount/chsink-spark\n"
        assert ok("kubectl get clickhousesinks -n data -o name").strip()
        ok(helm_line)  # a retry is an upgrade
        assert "REVISION: 2" in ok("helm status chsink -n chsink-system")
        ok("helm uninstall chsink -n chsink-system --wait && kubectl delete clickhousesinks --all -n data")

        wide = SET_LINE.sub("", "\n".join(lines[1:])) + "\n"  # "omit for a cluster-wide install"
        assert "watchNamespaces" not in wide
        ok(wide)
        roles = ok("kubectl get clusterroles -o name")
        assert "clusterrole.rbac.authorization.k8s.io/chsink-chsink-system-spark-driver" in roles.splitlines(), roles
        assert ok("kubectl get clickhousesinks -n data -o name").strip()
        ok("helm uninstall chsink -n chsink-system --wait")
