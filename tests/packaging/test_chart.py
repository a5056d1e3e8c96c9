"""The Helm chart: lint, template, server-side dry-run on the real API server, the values schema, and
least-privilege RBAC checked with `kubectl auth can-i` as the chart's own ServiceAccount."""

from __future__ import annotations

import filecmp
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hack.testbed.process import REPO, cached, versions

CHART = REPO / "charts" / "chsink"
VALUES = sorted((REPO / "examples" / "helm").glob("*.yaml"))
SINKS = sorted((REPO / "examples").glob("*.yaml"))
NS = "chsink-system"


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    exe = cached(f"helm-{versions()['HELM_VERSION']}") / "bin" / "helm"
    res = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)
    if check and res.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}")
    return res


def template(release: str, *values: Path, sets: tuple[str, ...] = (), namespace: str = NS) -> list[dict]:
    args = ["template", release, str(CHART), "-n", namespace, "--include-crds"]
    for v in values:
        args += ["-f", str(v)]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def test_chart_crds_are_the_repository_crds():
    names = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    assert names == sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    for n in names:
        assert filecmp.cmp(REPO / "crds" / n, CHART / "crds" / n, shallow=False), f"charts/chsink/crds/{n} is stale"


@pytest.mark.parametrize("values", [None, *VALUES], ids=lambda v: v.name if v else "defaults")
def test_helm_lint_and_template(values):
    extra = ["-f", str(values)] if values else []
    helm("lint", "--strict", str(CHART), *extra)
    docs = template("t", *([values] if values else []))
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "ServiceAccount", "CustomResourceDefinition"} <= kinds
    [dep] = [d for d in docs if d["kind"] == "Deployment"]
    pod = dep["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    assert env["CHSINK_SPARK_IMAGE"] and env["CHSINK_SPARK_VERSION"] == "4.0.0"


def test_values_schema_rejects_bad_values():
    for bad, field in [("logLevel=loud", "/logLevel"), ("metrics.port=70000", "/metrics/port"),
                       ("watchNamespaces[0]=Not_A_Namespace", "/watchNamespaces/0"),
                       ("spark.version=latest", "/spark/version"), ("imageTag=1", "imageTag")]:
        res = helm("template", "t", str(CHART), "--set", bad, check=False)
        assert res.returncode != 0 and "schema" in res.stderr and field in res.stderr, (bad, res.stderr)


def _apply_namespaces(kube, *names: str) -> None:
    for n in names:
        kube.kubectl("create", "namespace", n, check=False)


@pytest.mark.parametrize("values", [None, *VALUES], ids=lambda v: v.name if v else "defaults")
def test_rendered_manifests_pass_server_side_dry_run(kube, values):
    """The Prometheus Operator's kinds (ServiceMonitor, PodMonitor, PrometheusRule) are left out: its CRDs are not
    part of this test bed (promtool checks the rules: test_alerts.py)."""
    docs = [d for d in template("dry", *([values] if values else []))
            if not d["apiVersion"].startswith("monitoring.coreos.com/")]
    spaces = {d["metadata"].get("namespace") for d in docs} - {None}
    _apply_namespaces(kube, NS, *spaces)
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    kube.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(crds))
    for d in crds:
        kube.api.wait_crd(d["metadata"]["name"])
    rest = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
    res = kube.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(rest))
    assert res.stdout.count("(server dry run)") == len(rest)


@pytest.mark.parametrize("path", SINKS, ids=lambda p: p.name)
def test_examples_pass_server_side_dry_run(kube, path):
    from sinkoperator.model import SinkSpec
    from sinkoperator.render import render

    _apply_namespaces(kube, "examples")
    kube.kubectl("apply", "--server-side", "-f", str(CHART / "crds"))
    kube.api.wait_crd("clickhousesinks.chsink.io")
    res = kube.kubectl("apply", "-n", "examples", "--dry-run=server", "-f", str(path))
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert res.stdout.count("(server dry run)") == len(docs)
    for d in docs:
        if d["kind"] == "ClickHouseSink":  # and the operator renders it into a valid SparkApplication
            cm, app = render("examples", d["metadata"]["name"], SinkSpec.parse(d["spec"]))
            kube.kubectl("apply", "-n", "examples", "--dry-run=server", "-f", "-",
                         input=yaml.safe_dump_all([cm, app]))


S3_SINKS = [p for p in SINKS if any(d and d["kind"] == "ClickHouseSink" and d["spec"]["checkpointLocation"].startswith(
    "s3a://") for d in yaml.safe_load_all(p.read_text()))]


def test_eight_examples_checkpoint_on_s3():
    assert len(S3_SINKS) == 8, S3_SINKS


@pytest.mark.parametrize("path", S3_SINKS, ids=lambda p: p.name)
def test_an_example_that_checkpoints_on_s3_gives_its_driver_credentials_from_a_secret(path):
    """The image carries S3A (tests/node/test_images.py); the credentials reach the driver, which alone writes
    the checkpoint, from a Secret, never inlined."""
    from sinkoperator.model import SinkSpec
    from sinkoperator.render import render

    for d in (d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "ClickHouseSink"):
        driver = render("examples", d["metadata"]["name"], SinkSpec.parse(d["spec"]))[1]["spec"]["driver"]
        assert [s["secretRef"]["name"] for s in driver.get("envFrom", []) if "secretRef" in s] == ["chsink-s3"]
        assert not any(e["name"].startswith("AWS_") and "value" in e for e in driver["env"])


def can_i(kube, sa: str, verb: str, resource: str, namespace: str | None, *extra: str) -> bool:
    ns = ["-n", namespace] if namespace else ["--all-namespaces"]
    res = kube.kubectl("auth", "can-i", verb, resource, *ns, *extra, f"--as=system:serviceaccount:{NS}:{sa}",
                       check=False)
    return res.stdout.strip() == "yes"


@pytest.fixture(scope="module")
def scoped_install(kube):
    """The chart installed (applied for real) scoped to two namespaces, with named Secrets only."""
    _apply_namespaces(kube, NS, "data", "analytics", "elsewhere")
    docs = [d for d in template("scoped", REPO / "examples" / "helm" / "namespaced.yaml")
            if d["kind"] not in ("CustomResourceDefinition", "Deployment")]
    kube.kubectl("apply", "--server-side", "-f", str(CHART / "crds"))
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    return kube


ALLOWED = [
    ("get", "clickhousesinks.chsink.io"), ("list", "clickhousesinks.chsink.io"),
    ("watch", "clickhousesinks.chsink.io"), ("patch", "clickhousesinks.chsink.io"),
    ("patch", "clickhousesinks.chsink.io/status"), ("create", "sinkstatuses.chsink.io"),
    ("patch", "sinkstatuses.chsink.io"), ("create", "sparkapplications.sparkoperator.k8s.io"),
    ("update", "sparkapplications.sparkoperator.k8s.io"), ("delete", "sparkapplications.sparkoperator.k8s.io"),
    ("create", "configmaps"), ("patch", "configmaps"), ("create", "events"),
]
DENIED = [
    ("delete", "secrets"), ("list", "secrets"), ("watch", "secrets"), ("create", "secrets"),
    ("delete", "clickhousesinks.chsink.io"), ("create", "clickhousesinks.chsink.io"), ("delete", "configmaps"),
    ("create", "pods"), ("delete", "pods"), ("create", "deployments.apps"), ("create", "roles.rbac.authorization.k8s.io"),
    ("create", "rolebindings.rbac.authorization.k8s.io"), ("list", "sparkapplications.sparkoperator.k8s.io"),
]


def test_scoped_operator_can_do_its_work_in_watched_namespaces(scoped_install):
    for ns in ("data", "analytics"):
        for verb, res in ALLOWED:
            assert can_i(scoped_install, "scoped-chsink", verb, res, ns), f"cannot {verb} {res} in {ns}"
        assert can_i(scoped_install, "scoped-chsink", "get", "secrets/kafka-creds", ns)
        assert can_i(scoped_install, "scoped-chsink", "get", "secrets/clickhouse-creds", ns)


def test_scoped_operator_is_denied_everything_else(scoped_install):
    for ns in ("data", "analytics"):
        for verb, res in DENIED:
            assert not can_i(scoped_install, "scoped-chsink", verb, res, ns), f"may {verb} {res} in {ns}"
        assert not can_i(scoped_install, "scoped-chsink", "get", "secrets/unrelated", ns)
    for verb, res in ALLOWED:  # none of its work outside the watched namespaces, nor cluster-wide
        assert not can_i(scoped_install, "scoped-chsink", verb, res, "elsewhere"), f"may {verb} {res} elsewhere"
        assert not can_i(scoped_install, "scoped-chsink", verb, res, None), f"may {verb} {res} cluster-wide"
    assert not can_i(scoped_install, "scoped-chsink", "get", "secrets/kafka-creds", "elsewhere")
    # cluster-wide it may only list/watch namespace and CRD names, which kopf follows even when scoped
    assert can_i(scoped_install, "scoped-chsink", "watch", "namespaces", None)
    assert can_i(scoped_install, "scoped-chsink", "list", "customresourcedefinitions.apiextensions.k8s.io", None)
    assert not can_i(scoped_install, "scoped-chsink", "get", "namespaces", None)
    # and read the SparkApplication CRD's schema (is the spark-operator too old for spec.suspend?), no other CRD
    assert can_i(scoped_install, "scoped-chsink", "get",
                 "customresourcedefinitions.apiextensions.k8s.io/sparkapplications.sparkoperator.k8s.io", None)
    assert not can_i(scoped_install, "scoped-chsink", "get",
                     "customresourcedefinitions.apiextensions.k8s.io/clickhousesinks.chsink.io", None)
    assert not can_i(scoped_install, "scoped-chsink", "patch", "customresourcedefinitions.apiextensions.k8s.io", None)


def test_spark_service_account_manages_only_its_executors(scoped_install):
    for verb, res in [("create", "pods"), ("delete", "pods"), ("create", "services"), ("create", "configmaps"),
                      ("create", "persistentvolumeclaims")]:
        assert can_i(scoped_install, "chsink-spark", verb, res, "data") is False  # its SA lives in `data`, not NS
        ok = scoped_install.kubectl("auth", "can-i", verb, res, "-n", "data",
                                    "--as=system:serviceaccount:data:chsink-spark")
        assert ok.stdout.strip() == "yes"
    denied = scoped_install.kubectl("auth", "can-i", "get", "secrets", "-n", "data",
                                    "--as=system:serviceaccount:data:chsink-spark", check=False)
    assert denied.stdout.strip() == "no"


def test_cluster_wide_install_uses_a_cluster_role(kube):
    _apply_namespaces(kube, NS)
    docs = [d for d in template("wide") if d["kind"] not in ("CustomResourceDefinition", "Deployment")]
    assert {d["kind"] for d in docs} >= {"ClusterRole", "ClusterRoleBinding"}
    assert "Role" not in {d["kind"] for d in docs if d["metadata"]["name"] == "wide-chsink"}
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    assert can_i(kube, "wide-chsink", "list", "clickhousesinks.chsink.io", None)
    assert can_i(kube, "wide-chsink", "create", "sparkapplications.sparkoperator.k8s.io", "anywhere")
    assert can_i(kube, "wide-chsink", "get", "secrets", "anywhere")
    assert not can_i(kube, "wide-chsink", "list", "secrets", "anywhere")
    assert not can_i(kube, "wide-chsink", "delete", "secrets", "anywhere")
    assert not can_i(kube, "wide-chsink", "delete", "namespaces", None)


def _walk_schema(node: dict, path: str = "") -> Iterator[tuple[str, dict]]:
    for key, sub in node.get("properties", {}).items():
        yield f"{path}{key}", sub
        yield from _walk_schema(sub, f"{path}{key}.")


def test_every_value_is_described_in_the_schema():
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert [p for p, node in _walk_schema(schema) if not node.get("description")] == []
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) == set(schema["properties"]), "values.yaml and values.schema.json list other keys"


def test_two_replicas_elect_one_through_a_lease_and_a_drain_keeps_one():
    docs = template("ha", REPO / "examples" / "helm" / "ha-monitoring.yaml")
    [dep] = [d for d in docs if d["kind"] == "Deployment"]
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    [c] = dep["spec"]["template"]["spec"]["containers"]
    assert "--leader-election=ha-chsink" in c["args"] and "--log-format=json" in c["args"]
    assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"] if "valueFrom" in e} == \
        {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    [pdb] = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    [role] = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "ha-chsink-leader"]
    assert role["metadata"]["namespace"] == NS and role["rules"][1]["resourceNames"] == ["ha-chsink"]
    single = template("one", sets=("leaderElection.enabled=false", "replicaCount=3"))
    [dep] = [d for d in single if d["kind"] == "Deployment"]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    assert not [d for d in single if d["kind"] == "PodDisruptionBudget"]


def test_extra_env_and_args_reach_the_operator(tmp_path):
    values = tmp_path / "extra.yaml"
    values.write_text('extraEnv: [{name: CHSINK_STALL_SECONDS, value: "120"}]\nextraArgs: [--log-level=debug]\n')
    docs = template("x", values)
    [dep] = [d for d in docs if d["kind"] == "Deployment"]
    [c] = dep["spec"]["template"]["spec"]["containers"]
    assert {"name": "CHSINK_STALL_SECONDS", "value": "120"} in c["env"] and c["args"][-1] == "--log-level=debug"


def test_two_releases_named_alike_in_two_namespaces_do_not_collide():
    """Cluster-scoped objects carry the release's namespace in their names: a second release of the same name in
    another namespace needs no override, and the overrides still rename them."""
    def cluster_scoped(*sets: str, namespace: str = NS) -> set[str]:
        return {f"{d['kind']}/{d['metadata']['name']}" for d in template("chsink", sets=sets, namespace=namespace)
                if d["kind"] in ("ClusterRole", "ClusterRoleBinding")}

    for sets in ((), ("crds.upgradeHook.enabled=true",), ("watchNamespaces={data}",)):
        first, same, other = cluster_scoped(*sets), cluster_scoped(*sets), cluster_scoped(*sets, namespace="team-b")
        assert first == same and first and not first & other, (sets, first, other)
    first = cluster_scoped()
    assert not first & cluster_scoped("fullnameOverride=chsink-team-b")
    assert cluster_scoped("nameOverride=ops") == {n.replace("chsink", "chsink-ops", 1) for n in first}


def test_the_drivers_pod_monitor_selects_what_the_operator_renders_on_a_driver():
    """Opt-in: a PodMonitor whose selector, namespaces and port are those of the drivers the operator renders
    (their labels, their `metrics` container port), so the job's own metrics reach the Prometheus Operator."""
    from sinkoperator.model import SinkSpec
    from sinkoperator.render import render

    assert not [d for d in template("x") if d["kind"] == "PodMonitor"]  # off by default
    [mon] = [d for d in template("x", sets=("metrics.podMonitor.enabled=true", "watchNamespaces={data}"))
             if d["kind"] == "PodMonitor"]
    sample = yaml.safe_load((REPO / "tests" / "operator" / "sample.yaml").read_text())
    _, app = render("data", "orders", SinkSpec.parse(sample["spec"], "orders"))
    driver = app["spec"]["driver"]
    wanted = mon["spec"]["selector"]["matchLabels"]
    assert set(wanted) == {"app.kubernetes.io/managed-by", "spark-role"} and wanted["spark-role"] == "driver"
    # the operator's label, and the one Spark puts on every driver pod it starts
    assert driver["labels"]["app.kubernetes.io/managed-by"] == wanted["app.kubernetes.io/managed-by"]
    assert mon["spec"]["namespaceSelector"] == {"matchNames": ["data"]}
    [endpoint] = mon["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in driver["ports"]}
    [wide] = [d for d in template("x", sets=("metrics.podMonitor.enabled=true",)) if d["kind"] == "PodMonitor"]
    assert wide["spec"]["namespaceSelector"] == {"any": True}
