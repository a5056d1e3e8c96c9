"""The API server is real: CRDs applied with kubectl, CRs watched with the client, bad fields rejected."""

from __future__ import annotations

import threading

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

WIDGET_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.smoke.chsink.io}
spec:
  group: smoke.chsink.io
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
"""


def test_crd_apply_create_and_watch(kube):
    kube.kubectl("apply", "-f", "-", input=WIDGET_CRD)
    kube.api.wait_crd("widgets.smoke.chsink.io")
    api = client.CustomObjectsApi(kube.client())
    seen: list[str] = []
    w = watch.Watch()

    def run() -> None:
        for ev in w.stream(api.list_namespaced_custom_object, "smoke.chsink.io", "v1", "default", "widgets",
                           timeout_seconds=30):
            seen.append(f"{ev['type']}:{ev['object']['metadata']['name']}")
            if len(seen) >= 1:
                w.stop()

    t = threading.Thread(target=run)
    t.start()
    api.create_namespaced_custom_object("smoke.chsink.io", "v1", "default", "widgets",
                                        {"apiVersion": "smoke.chsink.io/v1", "kind": "Widget",
                                         "metadata": {"name": "w1"}, "spec": {"size": 3}})
    t.join(40)
    assert seen == ["ADDED:w1"]
    got = kube.kubectl("get", "widgets", "w1", "-o", "jsonpath={.spec.size}").stdout
    assert got == "3"


def test_sparkapplication_with_wrong_field_type_is_rejected(kube):
    api = client.CustomObjectsApi(kube.client())
    body = {
        "apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
        "metadata": {"name": "bad-types"},
        "spec": {"type": "Python", "mode": "cluster", "sparkVersion": "4.0.0",
                 "mainApplicationFile": "local:///opt/app.py",
                 "driver": {"cores": "two"}, "executor": {"instances": 1}},
    }
    with pytest.raises(ApiException) as err:
        api.create_namespaced_custom_object("sparkoperator.k8s.io", "v1beta2", "default", "sparkapplications", body)
    assert err.value.status == 422
    assert "spec.driver.cores" in err.value.body
    body["metadata"]["name"] = "good-types"
    body["spec"]["driver"]["cores"] = 1
    created = api.create_namespaced_custom_object("sparkoperator.k8s.io", "v1beta2", "default",
                                                  "sparkapplications", body)
    assert created["metadata"]["uid"]
