"""The operator runs as the Helm chart's ServiceAccount (a real token, RBAC on) scoped to one namespace,
and does its whole job there: proof that the chart's least-privilege rules are also sufficient."""

from __future__ import annotations

import re
import sys

import pytest
import yaml

from hack.testbed.process import REPO
from tests.packaging.test_chart import NS, template

from .conftest import kopf_runner
from .test_operator import wait_for

WATCHED = "rbac-data"


@pytest.fixture(scope="module")
def operator_as_chart_sa(chsink_crds, ch_factory, tmp_path_factory):
    kube = chsink_crds
    for ns in (NS, WATCHED):
        kube.kubectl("create", "namespace", ns, check=False)
    docs = [d for d in template("rbac", sets=(f"watchNamespaces[0]={WATCHED}", "rbac.secretNames[0]=ch-creds"))
            if d["kind"] not in ("CustomResourceDefinition", "Deployment")]
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    token = kube.kubectl("create", "token", "rbac-chsink", "-n", NS, "--duration=1h").stdout.strip()
    kubeconfig = tmp_path_factory.mktemp("sa") / "kubeconfig"
    kubeconfig.write_text(kube.api.kubeconfig_text(token, "rbac-chsink"))
    ch_factory()
    with kopf_runner(kubeconfig, WATCHED) as runner:
        kube.runner = runner
        yield kube
    # an HTTP 403 anywhere, but not the milliseconds of a log timestamp (",403")
    assert not re.search(r"(?<![,\d])403(?!\d)", runner.output) and "Forbidden" not in runner.output, \
        runner.output[-3000:]


def test_operator_with_chart_rbac_renders_reports_and_finalizes(operator_as_chart_sa, kafka, topic, ch_dsn, ch_db):
    kube = operator_as_chart_sa
    _, db = ch_db
    kube.kubectl("create", "secret", "generic", "ch-creds", "-n", WATCHED, "--from-literal=password=x", check=False)
    cr = {"apiVersion": "chsink.io/v1alpha1", "kind": "ClickHouseSink",
          "metadata": {"name": "rbac", "namespace": WATCHED},
          "spec": {"kafka": {"bootstrapServers": kafka.bootstrap, "topics": [topic(2)]},
                   "clickhouse": {"shards": [{"endpoint": ch_dsn}], "database": db, "tables": {"*": "events"},
                                  "credentialsSecretRef": {"name": "ch-creds"}},
                   "exactlyOnce": {"engine": "KeeperMap", "keeperPath": f"/rbac_{db}"},
                   "checkpointLocation": "/tmp/chsink-rbac-checkpoint", "deletionPolicy": "Delete"}}
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))
    app = wait_for("SparkApplication", lambda: get_ns(kube, "sparkapplication", "chsink-rbac"))
    assert app["spec"]["driver"]["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "ch-creds"
    assert get_ns(kube, "configmap", "chsink-rbac")
    wait_for("Deploying", lambda: (get_ns(kube, "clickhousesink", "rbac") or {}).get("status", {}).get("state")
             == "Deploying")
    kube.kubectl("patch", "sparkapplication", "chsink-rbac", "-n", WATCHED, "--subresource=status", "--type=merge",
                 "-p", '{"status": {"driverInfo": {}, "applicationState": {"state": "RUNNING"}}}')
    wait_for("Running", lambda: (get_ns(kube, "clickhousesink", "rbac") or {}).get("status", {}).get("state")
             == "Running")
    wait_for("SinkStatus (state store reached with the Secret read by the operator)",
             lambda: (get_ns(kube, "sinkstatus", "rbac") or {}).get("status", {}).get("partitionCount") == 2)
    events = kube.kubectl("get", "events", "-n", WATCHED, "-o", "yaml").stdout
    assert "SparkApplication chsink-rbac created" in events
    res = kube.kubectl("delete", "clickhousesink", "rbac", "-n", WATCHED, "--wait=true", "--timeout=120s", check=False)
    assert res.returncode == 0, kube.runner.output[-4000:]
    assert get_ns(kube, "sparkapplication", "chsink-rbac") is None


def test_a_secret_the_chart_does_not_grant_is_named_with_the_value_that_grants_it(operator_as_chart_sa, kafka, topic,
                                                                                  ch_dsn, ch_db):
    """A 403 on a Secret (the chart's rbac.secretNames leaves it out) is a condition and an Event naming the
    field, the Secret and the chart value; pointing the sink at a granted Secret recovers it untouched."""
    kube = operator_as_chart_sa
    _, db = ch_db
    for secret in ("ch-creds", "other-creds"):
        kube.kubectl("create", "secret", "generic", secret, "-n", WATCHED, "--from-literal=password=x", check=False)

    def apply(secret: str) -> None:
        cr = {"apiVersion": "chsink.io/v1alpha1", "kind": "ClickHouseSink",
              "metadata": {"name": "denied", "namespace": WATCHED},
              "spec": {"kafka": {"bootstrapServers": kafka.bootstrap, "topics": [topic(1)]},
                       "clickhouse": {"shards": [{"endpoint": ch_dsn}], "database": db, "tables": {"*": "events"},
                                      "credentialsSecretRef": {"name": secret}},
                       "exactlyOnce": {"engine": "KeeperMap", "keeperPath": f"/denied_{db}"},
                       "checkpointLocation": "/tmp/chsink-denied-checkpoint"}}
        kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(cr))

    def degraded():
        conds = (get_ns(kube, "clickhousesink", "denied") or {}).get("status", {}).get("conditions", [])
        return next((c for c in conds if c["type"] == "Degraded"), {})

    apply("other-creds")
    cond = wait_for("SecretUnavailable", lambda: (c := degraded()).get("reason") == "SecretUnavailable" and c)
    assert cond["message"] == ("spec.clickhouse.credentialsSecretRef: cannot read Secret rbac-data/other-creds: "
                               "the operator may not read it (RBAC: add it to the chart's rbac.secretNames)"), cond
    events = kube.kubectl("get", "events", "-n", WATCHED, "-o", "json", "--field-selector",
                          "involvedObject.name=denied,type=Warning,reason=SecretUnavailable").stdout
    assert "rbac-data/other-creds" in events
    print("\n--- a Secret the operator may not read (before)\n"
          + kube.kubectl("get", "chs", "denied", "-n", WATCHED).stdout, file=sys.__stdout__)
    apply("ch-creds")
    wait_for("recovered", lambda: degraded().get("status") == "False", timeout=30)
    assert wait_for("the job", lambda: get_ns(kube, "sparkapplication", "chsink-denied"))
    kube.kubectl("delete", "clickhousesink", "denied", "-n", WATCHED, "--wait=true", "--timeout=120s")


def get_ns(kube, kind: str, name: str):
    res = kube.kubectl("get", kind, name, "-n", WATCHED, "-o", "yaml", check=False)
    return yaml.safe_load(res.stdout) if res.returncode == 0 else None


def test_examples_dir_is_what_the_chart_notes_point_at():
    notes = (REPO / "charts" / "chsink" / "templates" / "NOTES.txt").read_text()
    assert "examples/minimal.yaml" in notes and (REPO / "examples" / "minimal.yaml").exists()
