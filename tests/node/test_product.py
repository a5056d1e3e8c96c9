"""chsink end to end on the node, as a user installs it: the chart's operator pod, the kubeflow spark-operator
and its webhook from their own chart, ZooKeeper, Kafka and two ClickHouse servers in pods. The operator renders
the ClickHouseSink into a SparkApplication, the spark-operator submits it, the driver pod starts an executor pod
and the executor writes over HTTP. Faults then hit the pods while a producer keeps writing; after each one the
verifier, run in the cluster from the job's own ConfigMap, finds no duplicate and no gap, and the sink's status
and Events say what happened.

`kubectl get chs,sinkstatus,sparkapp,pods` after each step goes to node-e2e.txt in the session's temporary
directory (and to stdout with -s).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import clickhouse_connect
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from hack.testbed.node import Cluster
from hack.testbed.process import REPO, cache_dir, cached, versions
from tests.e2e.harness import EVENTS_TABLE, BackgroundProducer, event
from tests.helpers import events_oldest_first

from .conftest import base_image, project_images

NS = "data"
SECURE_NS = "secure"  # enforces Pod Security `restricted` (infra.yaml)
SINK = "events"
APP = f"chsink-{SINK}"
TOPIC, DLQ = "events", "events-dlq"
PARTITIONS = 4
KAFKA = "10.96.0.20:9092"  # the Services' fixed ClusterIPs (infra.yaml), which the host reaches through kube-proxy
CLICKHOUSE = ("10.96.0.21", "10.96.0.22")
JOB_RETRY_S = 45
# a standby takes an unrenewed Lease within 17 s (docs/operator.md); then its kopf starts and reconciles
TAKEOVER_BOUND_S = 45
SCRATCH, ENV_SECRET = "/scratch", "chsink-node-env"  # the driver's own volume and its env from a Secret
# the node's S3 server (tests/node/infra.yaml) and how S3A reaches it: path-style, plain HTTP
BUCKET, S3_ACCESS_KEY, S3_SECRET_KEY = "chsink", "chsink", "node-secret-key"
S3A_CONF = {"spark.hadoop.fs.s3a.endpoint": "http://s3.data.svc.cluster.local:8080",
            "spark.hadoop.fs.s3a.endpoint.region": "us-east-1", "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": "false"}
SHARDS = ("http://clickhouse.data.svc.cluster.local:8123", "http://clickhouse-2.data.svc.cluster.local:8123")
DB = "e2e"
UNAVAILABLE = "chsink: unavailable:"  # how the verifier says it could not reach Kafka or ClickHouse


@dataclass
class Product:
    node: Cluster
    spark_image: str
    log: Path
    s3_root: Path  # the S3 server's filesystem backend on the host: bucket/key as directories and files
    producer: BackgroundProducer | None = None
    marks: list[str] = field(default_factory=list)
    verifier_pods: int = 0  # each verifier pod gets a new name: the last one may still be terminating

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.node.kubectl("-n", NS, *args, check=check)

    def get(self, kind: str, name: str) -> dict[str, Any]:
        res = self.kubectl("get", kind, name, "-o", "json", check=False)
        return json.loads(res.stdout) if res.returncode == 0 else {}

    def snapshot(self, step: str) -> None:
        """What a user sees, for the log (and the closing note)."""
        out = self.kubectl("get", "chs,sinkstatus,sparkapp,pods", "-o", "wide", check=False)
        events = self.kubectl("get", "events", "--field-selector", f"involvedObject.name={SINK}",
                              "--sort-by=.lastTimestamp", check=False)
        text = f"\n=== {time.strftime('%H:%M:%S')} {step}\n{out.stdout}{out.stderr}\n{events.stdout[-3000:]}"
        with self.log.open("a") as f:
            f.write(text)
        print(text)

    def sink_events(self) -> list[tuple[str, str]]:
        """(reason, message) of the Events on the ClickHouseSink, oldest first."""
        res = self.kubectl("get", "events", "--field-selector",
                           f"involvedObject.kind=ClickHouseSink,involvedObject.name={SINK}", "-o", "json")
        items = events_oldest_first(json.loads(res.stdout)["items"])
        return [(e["reason"], e.get("message", "")) for e in items]

    def state(self) -> str:
        return str(self.get("chs", SINK).get("status", {}).get("state", ""))

    def wait(self, what: str, ok: Callable[[], bool], timeout: float = 300, every: float = 2) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ok():
                return
            time.sleep(every)
        self.snapshot(f"TIMED OUT: {what}")
        raise AssertionError(f"{what}: not within {timeout}s (see {self.log})\n{self.diagnostics()}")

    def diagnostics(self) -> str:
        pods = self.kubectl("get", "pods", "-o", "name", check=False).stdout.split()
        logs = [f"--- {p}\n" + self.kubectl("logs", p, "--tail=40", check=False).stdout for p in pods
                if "driver" in p or "exec" in p]
        op = self.node.kubectl("-n", "chsink-system", "logs", "deploy/chsink", "--tail=40", check=False).stdout
        kafka = self.kubectl("logs", "deploy/kafka", "--tail=60", check=False)
        described = self.kubectl("describe", "pods", "-l", "app=kafka", check=False).stdout[-3000:]
        return "\n".join([*logs, f"--- operator\n{op}", f"--- kafka\n{kafka.stdout}{kafka.stderr}\n{described}"])[-16000:]

    def delivered(self) -> dict[int, int]:
        """Per partition of the topic, the offset below which the state store says every record is delivered
        (the slowest of its rows), from `kubectl get sinkstatus`."""
        out: dict[int, int] = {}
        for p in self.get("sinkstatus", SINK).get("status", {}).get("partitions") or []:
            if p["topic"] == TOPIC:
                pos = int(p["highWatermark"]) - int(p["lag"])
                out[p["partition"]] = min(out.get(p["partition"], pos), pos)
        return out

    def caught_up(self, highs: dict[int, int]) -> bool:
        done = self.delivered()
        return all(done.get(p, 0) >= h for p, h in highs.items() if h)

    def catch_up(self, what: str, timeout: float = 420) -> None:
        """Waits until the sink delivered everything in Kafka now (the producer may keep writing)."""
        try:
            highs = watermarks()
        except KafkaException:
            self.snapshot(f"{what}: Kafka does not answer")
            raise AssertionError(f"{what}: Kafka does not answer (see {self.log})\n{self.diagnostics()}") from None
        self.wait(f"{what}: the sink delivers every record produced so far", lambda: self.caught_up(highs), timeout)

    def verify(self) -> dict[str, Any]:
        """The verifier in the cluster, from the sink's ConfigMap, with the job's image."""
        overrides = {"spec": {"restartPolicy": "Never", "volumes": [{"name": "c", "configMap": {"name": APP}}],
                              "containers": [{"name": "verify", "image": self.spark_image, "imagePullPolicy": "Never",
                                              "command": ["python3", "/opt/chsink/main.py", "verify", "--config",
                                                          "/etc/chsink/sink.yaml", "--json"],
                                              "volumeMounts": [{"name": "c", "mountPath": "/etc/chsink"}]}]}}
        deadline = time.monotonic() + 180
        while True:  # a fault just dealt (a killed ClickHouse) may leave the service down a little longer
            self.verifier_pods += 1
            phase, text = self.node.run_pod(f"verify-{self.verifier_pods}", self.spark_image, namespace=NS,
                                            overrides=overrides)
            if UNAVAILABLE not in text or time.monotonic() > deadline:
                break
            time.sleep(3)
        at = 0 if text.startswith("{") else text.find("\n{")  # the report (indented JSON), after any log lines
        try:
            if at < 0:
                raise ValueError("no report")
            report: dict[str, Any] = json.loads(text[at:text.rindex("}") + 1])
        except ValueError:
            raise AssertionError(f"verifier failed ({phase}):\n{text[-3000:]}") from None
        totals = report["totals"]
        with self.log.open("a") as f:
            f.write(f"verifier: {json.dumps(totals)}\n")
        assert totals["duplicates"] == 0 and totals["gaps"] == 0 and totals.get("outside", 0) == 0, totals
        return report


def watermarks(timeout: float = 240) -> dict[int, int]:
    """The topic's end offsets, waiting out a broker restart (a fresh client each time: one that lost the broker
    may keep answering from stale metadata)."""
    deadline = time.monotonic() + timeout
    while True:
        c = Consumer({"bootstrap.servers": KAFKA, "group.id": "chsink-node-e2e", "enable.auto.commit": False})
        try:
            return {p: c.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1] for p in range(PARTITIONS)}
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)
        finally:
            c.close()


def sink(shards: int, state: str = "running") -> dict[str, Any]:
    return {
        "apiVersion": "chsink.io/v1alpha1", "kind": "ClickHouseSink", "metadata": {"name": SINK, "namespace": NS},
        "spec": {
            "state": state,
            "kafka": {"bootstrapServers": "kafka.data.svc.cluster.local:9092", "topics": [TOPIC]},
            "clickhouse": {"shards": [{"endpoint": e} for e in SHARDS[:shards]], "database": DB,
                           "tables": {TOPIC: "events"}},
            "exactlyOnce": {"engine": "KeeperMap"},
            "batching": {"maxOffsetsPerTrigger": 4000, "blockOffsets": 1000, "triggerInterval": "1 second"},
            "dlq": {"topic": DLQ},
            # on the node's S3 server, through S3A, with the credentials from a Secret (ENV_SECRET)
            "checkpointLocation": f"s3a://{BUCKET}/checkpoints/{SINK}",
            "deletionPolicy": "Delete",
            "spark": {"imagePullPolicy": "Never",  # the image: the chart's default (spark.image)
                      "sparkConf": S3A_CONF,
                      "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}],
                      "driver": {"cores": 1, "coreRequest": "200m", "memory": "768m",
                                 "envFrom": [{"secretRef": {"name": ENV_SECRET}}],
                                 "volumeMounts": [{"name": "scratch", "mountPath": SCRATCH}]},
                      "executor": {"cores": 1, "coreRequest": "200m", "memory": "768m", "instances": 1}},
        },
    }


def _volumes(node: Cluster) -> Path:
    root = node.workdir / "volumes"
    for name, uid in (("zookeeper", 185), ("kafka", 185), ("clickhouse", 101), ("clickhouse-2", 101), ("s3", 185),
                      (f"s3/{BUCKET}", 185)):  # a bucket of S3Proxy's filesystem backend is a directory
        (root / name).mkdir(parents=True, exist_ok=True)
        subprocess.run(["chown", f"{uid}:{uid}", str(root / name)], check=True)
    return root


def _rollout(node: Cluster, namespace: str, deployment: str, timeout: int = 110) -> None:
    node.kubectl("-n", namespace, "rollout", "status", f"deployment/{deployment}", f"--timeout={timeout}s")


@pytest.fixture(scope="module")
def product(node: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    t0 = time.monotonic()
    operator_image, spark_image = project_images()
    infra = {n: base_image(n) for n in ("zookeeper", "kafka", "clickhouse")}
    spark_operator = base_image("spark-operator")
    node.load([*infra.values(), spark_operator, operator_image, spark_image])
    loaded = time.monotonic()

    volumes = _volumes(node)
    manifest = (Path(__file__).parent / "infra.yaml").read_text().replace("@VOLUMES@", str(volumes))
    manifest = manifest.replace("@S3PROXY@", str(cached(f"s3proxy-{versions()['S3PROXY_VERSION']}"))).replace(
        "@S3_ACCESS_KEY@", S3_ACCESS_KEY).replace("@S3_SECRET_KEY@", S3_SECRET_KEY)
    for name, image in infra.items():
        manifest = manifest.replace(f"@{name.upper()}@", image)
    node.kubectl("apply", "-f", "-", input=manifest)

    repo, tag = spark_operator.rsplit(":", 1)
    registry, repository = repo.split("/", 1)
    node.helm("install", "spark-operator", str(cache_dir() / f"spark-operator-{versions()['SPARK_OPERATOR_VERSION']}"
                                                 / "chart"),
              "-n", "spark-operator", "--create-namespace", "--wait", "--timeout=5m",
              "--set", f"image.registry={registry}", "--set", f"image.repository={repository}",
              "--set", f"image.tag={tag}", "--set", "image.pullPolicy=Never",
              "--set", f"spark.jobNamespaces={{{NS},{SECURE_NS}}}",
              "--set", "controller.leaderElection.enable=false", "--set", "webhook.leaderElection.enable=false",
              "--set", "prometheus.metrics.enable=false", "--set", "controller.uiService.enable=false")
    op_repo, op_tag = operator_image.rsplit(":", 1)
    node.helm("install", "chsink", str(REPO / "charts" / "chsink"), "-n", "chsink-system", "--create-namespace",
              "--wait", "--timeout=3m", "--set", f"image.repository={op_repo}", "--set", f"image.tag={op_tag}",
              "--set", "image.pullPolicy=Never", "--set", f"spark.image={spark_image}",
              "--set", f"watchNamespaces={{{NS},{SECURE_NS}}}", "--set", "statusIntervalSeconds=3",
              "--set", "replicaCount=2",
              # a job held on an error only a fix outside Kubernetes can clear is tried again after 45 s, not 300
              "--set-json", f'extraEnv=[{{"name": "CHSINK_JOB_RETRY_SECONDS", "value": "{JOB_RETRY_S}"}}]')
    for deployment in ("zookeeper", "kafka", "clickhouse", "clickhouse-2", "s3"):
        _rollout(node, NS, deployment)
    installed = time.monotonic()

    for ns in (NS, SECURE_NS):
        node.kubectl("-n", ns, "create", "secret", "generic", ENV_SECRET, "--from-literal=CHSINK_NODE_MARK=from-a-secret",
                     f"--from-literal=AWS_ACCESS_KEY_ID={S3_ACCESS_KEY}",
                     f"--from-literal=AWS_SECRET_ACCESS_KEY={S3_SECRET_KEY}")
    kafka = AdminClient({"bootstrap.servers": KAFKA})  # kept: its futures fail once it is collected
    for fut in kafka.create_topics([NewTopic(TOPIC, PARTITIONS, 1), NewTopic(DLQ, 1, 1)]).values():
        fut.result(60)
    for host in CLICKHOUSE:
        client = clickhouse_connect.get_client(host=host, port=8123)
        client.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
        client.command(EVENTS_TABLE.format(db=DB))

    log = tmp_path_factory.getbasetemp() / "node-e2e.txt"
    p = Product(node, spark_image, log, volumes / "s3")
    log.write_text(f"images loaded in {loaded - t0:.0f}s; charts and data services installed in "
                   f"{installed - loaded:.0f}s\n")
    yield p
    if p.producer is not None:
        p.producer.stopped.set()


def _fault(p: Product, step: str, act: Callable[[], None]) -> list[tuple[str, str]]:
    """Acts, then waits until the sink runs again and has delivered everything produced until then; returns
    the Events posted on the sink meanwhile."""
    before = len(p.sink_events())
    act()
    p.snapshot(f"{step}: just after")
    p.wait(f"{step}: the sink runs again", lambda: p.state() == "Running", timeout=420)
    p.catch_up(step)
    p.snapshot(f"{step}: recovered")
    p.verify()
    return p.sink_events()[before:]


JVM_INFO = re.compile(r'^\d\d/\d\d/\d\d \d\d:\d\d:\d\d INFO |^\{"ts":.*"level":"INFO"')  # Spark's two layouts


def _jvm_info(log: str) -> list[str]:
    """The INFO lines a JVM logged through log4j (the writer's own Python lines look otherwise)."""
    return [line for line in log.splitlines() if JVM_INFO.search(line)]


def _java_commands(p: Product, selector: str) -> list[str]:
    """The command lines of the JVMs in the pod the selector names, read from its /proc."""
    pod = p.kubectl("get", "pods", "-l", selector, "-o", "jsonpath={.items[0].metadata.name}").stdout.strip()
    out = p.kubectl("exec", pod, "--", "sh", "-c",
                    "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < \"$f\"; echo; done").stdout
    return [line for line in out.splitlines() if line.split(" ", 1)[0].endswith("/java")]


def _kill_the_holder_mid_change(p: Product) -> None:
    """Two replicas from the chart, one holding the Lease: its process is SIGKILLed (from the host, and its pod
    deleted, so it cannot come back as itself), then the sink's spec changes. The standby takes the Lease, one
    transition later, and applies the change within the documented bound: no one else could have."""
    def lease() -> dict[str, Any]:
        return dict(json.loads(p.node.kubectl("-n", "chsink-system", "get", "lease", "chsink", "-o", "json").stdout)
                    ["spec"])

    def app_hash() -> str:
        return str(p.get("sparkapp", APP)["metadata"]["annotations"]["chsink.io/spec-hash"])

    held = lease()
    holder = held["holderIdentity"]
    pods = p.node.kubectl("-n", "chsink-system", "get", "pods", "-l", "app.kubernetes.io/name=chsink", "-o",
                          "jsonpath={.items[*].metadata.name}").stdout.split()
    standby = next(n for n in pods if n != holder)
    assert f"the Lease chsink-system/chsink is held by {holder}" in p.node.kubectl(
        "-n", "chsink-system", "logs", standby).stdout, "the other replica waits as a standby"
    before = app_hash()
    killed = _sigkill_pod(holder)
    p.node.kubectl("-n", "chsink-system", "delete", "pod", holder, "--grace-period=0", "--force", "--wait=false")
    t0 = time.monotonic()
    p.kubectl("patch", "chs", SINK, "--type=merge", "-p", '{"spec": {"batching": {"triggerInterval": "2 seconds"}}}')
    p.wait("the standby applies the change", lambda: app_hash() != before, timeout=90, every=0.5)
    took = time.monotonic() - t0
    now = lease()
    assert (now["holderIdentity"], now.get("leaseTransitions", 0)) == (standby, held.get("leaseTransitions", 0) + 1)
    log = p.node.kubectl("-n", "chsink-system", "logs", standby).stdout
    assert f"acquired the Lease chsink-system/chsink as {standby}" in log, log[-3000:]
    p.marks.append(f"the standby applied a change {took:.1f}s after the holder ({killed} processes) was SIGKILLed")
    assert took < TAKEOVER_BOUND_S, took


def _operator_lag(p: Product) -> float:
    return _operator_metric(p, "chsink_operator_sink_lag")


def _operator_metric(p: Product, name: str) -> float:
    """The sink's series as the acting operator replica's /metrics says (the standby serves no per-sink series):
    its pod, named by the Lease, scraped at its IP from the host."""
    holder = json.loads(p.node.kubectl("-n", "chsink-system", "get", "lease", "chsink", "-o", "json").stdout)[
        "spec"]["holderIdentity"]
    ip = p.node.kubectl("-n", "chsink-system", "get", "pod", holder, "-o", "jsonpath={.status.podIP}").stdout.strip()
    text = urllib.request.urlopen(f"http://{ip}:9090/metrics", timeout=10).read().decode()
    line = f'{name}{{namespace="{NS}",sink="{NS}.{SINK}"}} '
    return float(next(x for x in text.splitlines() if x.startswith(line))[len(line):])


def _sigkill_pod(pod: str) -> int:
    """SIGKILLs, from the host, every process of the pod (the chart gives each POD_NAME): the node is this machine."""
    n = 0
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"POD_NAME={pod}\0".encode() in env.read_bytes():
                os.kill(int(env.parent.name), signal.SIGKILL)
                n += 1
        except OSError:  # gone meanwhile, or a kernel thread
            pass
    assert n, f"no process of pod {pod} found"
    return n


def _delete(p: Product, selector: str, *extra: str) -> Callable[[], None]:
    def act() -> None:
        names = p.kubectl("get", "pods", "-l", selector, "-o", "name").stdout.split()
        assert names, f"no pod matches {selector}"
        p.kubectl("delete", *names, "--wait=false", *extra)
    return act


# six scenarios in one run of the product (chaos, the verifier, a pod template, a configuration error, ...), each
# with its own bounds: together they came to 900 s, pytest's default per test, on a loaded CI machine (1dc2cd4's
# CI timed out in the last one while it was making progress)
@pytest.mark.timeout(1800)
def test_the_product_runs_end_to_end_on_the_node_and_survives_its_faults(product: Product) -> None:
    p = product
    t0 = time.monotonic()
    p.node.kubectl("apply", "-f", "-", input=json.dumps(sink(shards=1)))
    p.wait("the sink runs", lambda: p.state() == "Running", timeout=420)
    p.marks.append(f"sink running {time.monotonic() - t0:.0f}s after kubectl apply")
    driver = p.get("pod", f"{APP}-driver")
    assert driver.get("spec", {}).get("volumes"), "the webhook mounted the sink's ConfigMap"
    # the sink's own env from a Secret and its volume reach the driver (the spark-operator's webhook adds them),
    # and the checkpoint is written on S3 with the Secret's credentials (S3Proxy keeps each object as a file)
    env = p.kubectl("exec", f"{APP}-driver", "--", "printenv", "CHSINK_NODE_MARK").stdout.strip()
    assert env == "from-a-secret", env
    p.kubectl("exec", f"{APP}-driver", "--", "test", "-w", SCRATCH)
    checkpoint = p.s3_root / BUCKET / "checkpoints" / SINK
    p.wait("the checkpoint on S3", lambda: (checkpoint / "_chsink_sink").is_file(), timeout=120)
    p.wait("the driver starts an executor pod", lambda: "Running" in p.kubectl(
        "get", "pods", "-l", "spark-role=executor", "-o", "jsonpath={.items[*].status.phase}").stdout, timeout=300)

    p.producer = BackgroundProducer(SimpleNamespace(bootstrap=KAFKA), TOPIC, total=10**9,  # type: ignore[arg-type]
                                    per_second=300, partitions=PARTITIONS)
    p.producer.start()
    p.catch_up("first records")
    p.snapshot("running, producing")
    p.verify()
    # every JVM of the image, the executor where Spark's Kafka source runs included, logs Spark and the Kafka
    # client at WARN (the image's LOG4J_CONFIGURATION_FILE): their INFO lines cost CPU on every task
    info = {role: _jvm_info(p.kubectl("logs", "-l", f"spark-role={role}", "--tail=-1").stdout)[:3]
            for role in ("driver", "executor")}
    assert not any(info.values()), f"INFO lines: {info}"
    # and runs the throughput collector (the operator renders it into sparkConf's extraJavaOptions)
    jvms = {role: _java_commands(p, f"spark-role={role}") for role in ("driver", "executor")}
    assert all(cmds and all("-XX:+UseParallelGC" in c for c in cmds) for cmds in jvms.values()), jvms

    # each fault while producing; the Events on the sink tell what it went through
    events = _fault(p, "delete an executor pod", _delete(p, "spark-role=executor"))
    assert "ExecutorLost" in {r for r, _ in events}, events
    job = _fault(p, "kill the driver pod", _delete(p, "spark-role=driver", "--grace-period=0", "--force"))
    assert any(r != "Running" for r, _ in job), job
    def rotate() -> None:  # the job reads its Secrets at start: a rotation restarts it, through the driver's annotation
        p.kubectl("patch", "secret", ENV_SECRET, "-p", json.dumps({"stringData": {"CHSINK_NODE_MARK": "rotated"}}))
        p.wait("a driver with the rotated Secret", lambda: p.kubectl(
            "exec", f"{APP}-driver", "--", "printenv", "CHSINK_NODE_MARK", check=False).stdout.strip() == "rotated",
            timeout=240)
    _fault(p, "rotate a Secret the driver reads", rotate)
    _fault(p, "kill the active operator replica with a change pending", lambda: _kill_the_holder_mid_change(p))
    _fault(p, "kill the ClickHouse pod", _delete(p, "app=clickhouse", "--grace-period=0", "--force"))
    def restart_kafka() -> None:
        p.kubectl("rollout", "restart", "deployment/kafka")
        p.wait("Kafka restarted", lambda: p.kubectl("rollout", "status", "deployment/kafka", "--timeout=5s",
                                                    check=False).returncode == 0, timeout=240)
    _fault(p, "restart Kafka", restart_kafka)

    p.kubectl("patch", "chs", SINK, "--type=merge", "-p", '{"spec": {"state": "paused"}}')
    # the spark-operator reports SUSPENDED as it deletes the driver pod, which then finishes the batch it is in
    # (on SIGTERM, by design): the sink is Pausing until no pod of the job is left, and Paused means nothing lands
    p.wait("paused", lambda: p.state() == "Paused", timeout=180)
    p.snapshot("paused")
    paused = p.delivered()
    assert p.get("sparkapp", APP).get("status", {}).get("applicationState", {}).get("state") == "SUSPENDED"
    lag_paused = _operator_lag(p)
    time.sleep(10)
    assert p.delivered() == paused, "a paused sink writes nothing"
    # the operator's lag gauge rises while the producer goes on (and falls once resumed, below)
    p.wait("the operator's lag gauge rises", lambda: _operator_lag(p) > lag_paused + 600, timeout=60)
    lag_high = _operator_lag(p)
    pausing = [r for r, _ in p.sink_events() if r in ("Pausing", "Paused")]  # the run's only pause
    assert pausing == ["Pausing", "Paused"], pausing
    events = _fault(p, "resume", lambda: p.kubectl("patch", "chs", SINK, "--type=merge",
                                                    "-p", '{"spec": {"state": "running"}}'))
    assert ("Running" in {r for r, _ in events}), events
    p.wait("the operator's lag gauge falls", lambda: _operator_lag(p) < lag_high / 2, timeout=60)
    p.marks.append(f"operator lag gauge {lag_paused:.0f} paused, {lag_high:.0f} 10 s later, "
                   f"{_operator_lag(p):.0f} resumed")

    events = _fault(p, "add a shard (live rebalance)",
                    lambda: p.node.kubectl("apply", "-f", "-", input=json.dumps(sink(shards=2))))
    status = p.get("chs", SINK)["status"]
    assert status["shards"] == "2" and len(status["layout"]["endpoints"]) == 2, status
    assert "Draining" in {r for r, _ in events}, events
    second = clickhouse_connect.get_client(host=CLICKHOUSE[1], port=8123)
    p.wait("the new shard gets rows", lambda: second.command(f"SELECT count() FROM {DB}.events") > 0, timeout=120)

    assert p.producer is not None
    p.producer.finish()
    p.catch_up("the last records")
    p.wait("lag 0", lambda: p.get("sinkstatus", SINK).get("status", {}).get("lag") == 0)
    p.snapshot("done")
    report = p.verify()
    totals = report["totals"]
    assert totals["pending"] == 0 and totals["clickhouse"] + totals["dead_lettered"] == p.producer.sent, totals
    assert totals["dead_lettered"] == p.producer.bad, totals
    with p.log.open("a") as f:
        f.write(f"{'; '.join(p.marks)}; run {time.monotonic() - t0:.0f}s; {p.producer.sent} records\n")
    _the_scheduled_verifier_finds_what_was_damaged_and_changes_nothing(p)
    _a_configuration_error_is_described_and_held(p)
    _a_recreated_sink_is_refused_until_told_where_to_start(p)


def _verification(p: Product) -> tuple[dict[str, Any], dict[str, Any]]:
    status = p.get("chs", SINK).get("status", {})
    cond = next((c for c in status.get("conditions", []) if c["type"] == "Verified"), {})
    return status.get("verification", {}), cond


def _the_scheduled_verifier_finds_what_was_damaged_and_changes_nothing(p: Product) -> None:
    """spec.verify after the chaos run: its Job reports OK for every offset delivered. Then records arrive, and of
    them two rows are deleted from ClickHouse and one is stored twice: the next run names those offsets in the
    condition, the Event and the metric, and changes nothing. Repaired and spec.verify removed, nothing is left."""
    t0 = time.monotonic()
    p.kubectl("patch", "chs", SINK, "--type=merge", "-p", json.dumps({"spec": {"verify": {
        "schedule": "20s", "window": "0s"}}}))
    p.wait("Verified", lambda: _verification(p)[1].get("status") == "True", timeout=300)
    first = _verification(p)[0]
    delivered = p.delivered()
    assert first["offsets"] == sum(delivered.values()), (first, delivered)
    p.marks.append(f"scheduled verifier: {first['summary']} {time.monotonic() - t0:.0f}s after spec.verify")
    # new records on partition 0, then damage among them: what the last run verified is not looked at again
    start = delivered[0]
    producer = Producer({"bootstrap.servers": KAFKA, "enable.idempotence": True})
    for i in range(200):
        producer.produce(TOPIC, json.dumps(event(20_000_000 + i)).encode(), key=b"verify", partition=0)
    assert producer.flush(60) == 0
    p.catch_up("the records the verifier checks next")
    gone, twice = [start + 1, start + 2], start + 3
    cond = f"_topic = '{TOPIC}' AND _partition = 0 AND _offset IN ({gone[0]}, {gone[1]}, {twice})"
    [shard] = [c for c in (clickhouse_connect.get_client(host=h, port=8123) for h in CLICKHOUSE)
               if int(str(c.command(f"SELECT count() FROM {DB}.events WHERE {cond}"))) == 3]
    kept = shard.query(f"SELECT * FROM {DB}.events WHERE {cond}")
    shard.command(f"ALTER TABLE {DB}.events DELETE WHERE _topic = '{TOPIC}' AND _partition = 0 AND "
                  f"_offset IN ({gone[0]}, {gone[1]})", settings={"mutations_sync": 2})
    shard.command(f"INSERT INTO {DB}.events SELECT * FROM {DB}.events WHERE _topic = '{TOPIC}' AND _partition = 0 "
                  f"AND _offset = {twice}", settings={"insert_deduplicate": 0})
    damaged = _rows()
    finding = f"{TOPIC}/0: 1 duplicated offset(s) [{twice}], 2 missing offset(s) {gone}"
    p.wait("VerifyAnomaly", lambda: _verification(p)[1].get("reason") == "VerifyAnomaly", timeout=300)
    verification, condition = _verification(p)
    assert condition["status"] == "False" and finding in condition["message"], condition
    assert verification["findings"] == [finding], verification
    warned = [m for r, m in p.sink_events() if r == "VerifyAnomaly"]
    assert warned and finding in warned[-1], warned
    assert _operator_metric(p, "chsink_operator_sink_verify_anomalies") == 1
    column = p.kubectl("get", "chs", SINK).stdout
    assert f"ANOMALY {finding}"[:60] in column, column
    assert _rows() == damaged, "the verifier changes no data"
    # repaired by hand: the three rows as they were
    shard.command(f"ALTER TABLE {DB}.events DELETE WHERE {cond}", settings={"mutations_sync": 2})
    shard.insert(f"{DB}.events", kept.result_rows, column_names=list(kept.column_names),
                 settings={"insert_deduplicate": 0})
    p.wait("Verified again once repaired", lambda: _verification(p)[1].get("status") == "True", timeout=300)
    p.kubectl("patch", "chs", SINK, "--type=json", "-p", '[{"op": "remove", "path": "/spec/verify"}]')
    p.wait("no verification left", lambda: not any(_verification(p)), timeout=120)
    with p.log.open("a") as f:
        f.write(f"--- scheduled verifier: {first['summary']}; then {finding}; {time.monotonic() - t0:.0f}s\n"
                f"{column}\n")


def _rows() -> int:
    return sum(int(str(clickhouse_connect.get_client(host=h, port=8123).command(f"SELECT count() FROM {DB}.events")))
               for h in CLICKHOUSE)


def _a_recreated_sink_is_refused_until_told_where_to_start(p: Product) -> None:
    """Deleted with deletionPolicy Delete (its state rows and its S3 checkpoint gone, the latter through the
    operator's cleanup Job), then applied again as it was: its tables hold rows of its topic and it has no state, so it is refused, naming the choice,
    instead of delivering the topic a second time; told `startingOffsets: latest`, it delivers only what comes
    after, once."""
    t0 = time.monotonic()
    rows = _rows()
    checkpoint = p.s3_root / BUCKET / "checkpoints" / SINK
    assert any(f.is_file() for f in checkpoint.rglob("*")), "the checkpoint is on S3"
    p.kubectl("delete", "chs", SINK, "--wait=true", "--timeout=240s")
    # its S3 checkpoint went with it, through a Job with the driver's credentials (envFrom) and S3A settings
    cleaned = [m for r, m in p.sink_events() if r == "CheckpointCleanup"]
    assert cleaned and cleaned[-1] == f"deleted checkpoint s3a://{BUCKET}/checkpoints/{SINK}", cleaned
    left = [str(f) for f in checkpoint.rglob("*") if f.is_file()] if checkpoint.exists() else []
    assert not left, left
    jobs = p.kubectl("get", "jobs", "-o", "name").stdout.split()
    assert not [j for j in jobs if "checkpoint-cleanup" in j], jobs
    again = sink(shards=2)
    p.node.kubectl("apply", "-f", "-", input=json.dumps(again))

    def degraded() -> dict[str, Any]:
        conds = p.get("chs", SINK).get("status", {}).get("conditions", [])
        return next((c for c in conds if c["type"] == "Degraded"), {})

    p.wait("refused", lambda: degraded().get("reason") == "JobConfigError", timeout=420)
    message = degraded()["message"]
    assert "startingOffsets" in message and "events" in message, message
    assert _rows() == rows, "nothing delivered again"
    again["spec"]["kafka"]["startingOffsets"] = "latest"
    p.node.kubectl("apply", "-f", "-", input=json.dumps(again))
    p.wait("running from latest", lambda: p.state() == "Running", timeout=420)
    # `latest` is resolved when each shard's query starts, a little after its driver runs: what is produced before
    # that is rightly skipped. Probes go to every partition until each has a state row, so each shard's query is up.
    probes = _probe_until_every_partition_is_delivered(p)
    p.catch_up("the probes")
    assert rows <= _rows() <= rows + probes, ("nothing from before the re-creation delivered again", rows, probes)
    rows = _rows()
    p.producer = BackgroundProducer(SimpleNamespace(bootstrap=KAFKA), TOPIC, total=3000,  # type: ignore[arg-type]
                                    per_second=300, partitions=PARTITIONS)
    p.producer.start()
    p.wait("3,000 records produced", lambda: p.producer is not None and p.producer.sent >= 3000, timeout=120)
    p.producer.finish()
    p.catch_up("the records after the re-creation")
    assert _rows() == rows + p.producer.sent - p.producer.bad, (rows, p.producer.sent, p.producer.bad)
    p.verify()
    with p.log.open("a") as f:
        f.write(f"--- re-created: refused, then from latest, {time.monotonic() - t0:.0f}s\n{message}\n")


def _probe_until_every_partition_is_delivered(p: Product, timeout: float = 300) -> int:
    """One well-formed record per partition every few seconds until the sink status shows a state row for each;
    returns how many were sent."""
    producer = Producer({"bootstrap.servers": KAFKA, "enable.idempotence": True})
    sent, deadline = 0, time.monotonic() + timeout
    while len(p.delivered()) < PARTITIONS:
        assert time.monotonic() < deadline, f"probes not delivered on every partition within {timeout}s: {p.delivered()}"
        for partition in range(PARTITIONS):
            producer.produce(TOPIC, json.dumps(event(10_000_000 + sent)).encode(), key=b"probe", partition=partition)
            sent += 1
        assert producer.flush(60) == 0
        time.sleep(3)
    return sent


def _a_configuration_error_is_described_and_held(p: Product) -> None:
    """A sink whose table does not exist: the job's own words (its container's termination message, through the
    kubelet) in `kubectl describe chs`, the application suspended rather than resubmitted in a loop, and running
    once the table is created."""
    t0 = time.monotonic()
    broken = sink(shards=1)
    broken["metadata"]["name"] = "broken"
    broken["spec"]["clickhouse"]["tables"] = {TOPIC: "events_missing"}
    broken["spec"]["checkpointLocation"] = "/tmp/chsink/broken"
    p.node.kubectl("apply", "-f", "-", input=json.dumps(broken))

    def degraded() -> dict[str, Any]:
        conds = p.get("chs", "broken").get("status", {}).get("conditions", [])
        return next((c for c in conds if c["type"] == "Degraded"), {})

    p.wait("JobConfigError", lambda: degraded().get("reason") == "JobConfigError", timeout=420)
    message = degraded()["message"]
    assert "events_missing" in message and "does not exist" in message and "not resubmitted" in message, message
    p.wait("held: suspended", lambda: p.get("sparkapp", "chsink-broken").get("status", {})
           .get("applicationState", {}).get("state") == "SUSPENDED", timeout=180)
    describe = p.kubectl("describe", "chs", "broken").stdout
    assert "events_missing" in describe and "JobConfigError" in describe, describe
    time.sleep(20)  # the spark-operator would have resubmitted it by now
    drivers = p.kubectl("get", "pods", "-l", "sparkoperator.k8s.io/app-name=chsink-broken,spark-role=driver",
                        "-o", "name").stdout.split()
    assert not drivers, drivers
    assert p.get("chs", "broken")["status"]["state"] == "Failed"
    # the fix, made outside Kubernetes: the job is tried again within JOB_RETRY_S of its failure, and runs
    client = clickhouse_connect.get_client(host=CLICKHOUSE[0], port=8123)
    client.command(EVENTS_TABLE.format(db=DB).replace(".events ", ".events_missing "))
    p.wait("running once the table exists", lambda: p.get("chs", "broken").get("status", {}).get("state") == "Running",
           timeout=JOB_RETRY_S + 300)
    p.wait("rows in the new table", lambda: client.command(f"SELECT count() FROM {DB}.events_missing") > 0,
           timeout=180)
    with p.log.open("a") as f:
        f.write(f"--- a missing table, described and held {time.monotonic() - t0:.0f}s after kubectl apply\n"
                f"{describe[describe.find('Status:'):]}\n")
    p.kubectl("delete", "chs", "broken", "--wait=true", "--timeout=120s")


# a pod template a hardened cluster asks for: dedicated nodes (a toleration and a node selector), a security
# context of the team's own that still passes `restricted`, and a label for its cost reports
TEMPLATE = {"nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "chsink.io/dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                "runAsNonRoot": True, "runAsUser": 185},
            "labels": {"team": "node-e2e"}}


def test_a_sink_with_a_pod_template_runs_where_pod_security_restricted_is_enforced(product: Product) -> None:
    """A sink in a namespace whose PodSecurity admission enforces `restricted`: its driver and executor pods carry
    the template (toleration, node selector, security context, label) with the operator's restricted pod
    defaults, env from a Secret and a volume; they are admitted, run, and deliver. A pod that does not pass
    `restricted` is refused there, so the admission is on."""
    p = product
    t0 = time.monotonic()
    refused = p.node.kubectl("-n", SECURE_NS, "run", "privileged", f"--image={p.spark_image}", "--restart=Never",
                             "--image-pull-policy=Never", "--overrides", json.dumps({"spec": {"containers": [
                                 {"name": "privileged", "image": p.spark_image,
                                  "securityContext": {"privileged": True}}]}}), check=False)
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr, refused.stderr
    client = clickhouse_connect.get_client(host=CLICKHOUSE[0], port=8123)
    client.command(EVENTS_TABLE.format(db=DB).replace(".events ", ".events_secure "))
    secure = sink(shards=1)
    secure["metadata"] = {"name": "hardened", "namespace": SECURE_NS}
    spec = secure["spec"]
    spec.update(clickhouse={**spec["clickhouse"], "tables": {TOPIC: "events_secure"}}, deletionPolicy="Retain",
                checkpointLocation=f"{SCRATCH}/checkpoints/hardened")
    spec["spark"]["sparkConf"] = {}
    spec["spark"]["driver"].update(TEMPLATE)
    spec["spark"]["executor"].update(TEMPLATE, envFrom=[{"secretRef": {"name": ENV_SECRET}}],
                                     volumeMounts=[{"name": "scratch", "mountPath": SCRATCH}])
    p.node.kubectl("apply", "-f", "-", input=json.dumps(secure))

    def pods(role: str) -> list[dict[str, Any]]:
        out = p.node.kubectl("-n", SECURE_NS, "get", "pods", "-l", f"spark-role={role},chsink.io/sink=hardened",
                             "-o", "json").stdout
        return [q for q in json.loads(out)["items"] if q["status"].get("phase") == "Running"]

    p.wait("the hardened sink's driver and executor run", lambda: bool(pods("driver") and pods("executor")),
           timeout=420)
    for role in ("driver", "executor"):
        [pod] = pods(role)[:1]
        podspec = pod["spec"]
        [container] = [c for c in podspec["containers"] if c["name"].startswith("spark-kubernetes")]
        assert TEMPLATE["tolerations"][0] in podspec["tolerations"], (role, podspec["tolerations"])
        assert podspec["nodeSelector"] == TEMPLATE["nodeSelector"], (role, podspec.get("nodeSelector"))
        assert container["securityContext"] == TEMPLATE["securityContext"], (role, container.get("securityContext"))
        assert podspec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, role  # the default
        assert pod["metadata"]["labels"]["team"] == "node-e2e", role
        assert {"secretRef": {"name": ENV_SECRET}} in container.get("envFrom", []), (role, container.get("envFrom"))
        assert any(m["mountPath"] == SCRATCH for m in container.get("volumeMounts", [])), role
    p.wait("the hardened sink delivers", lambda: client.command(f"SELECT count() FROM {DB}.events_secure") > 0,
           timeout=240)
    p.node.kubectl("-n", SECURE_NS, "delete", "chs", "hardened", "--wait=true", "--timeout=120s")
    with p.log.open("a") as f:
        f.write(f"--- a sink with a pod template ran under Pod Security restricted {time.monotonic() - t0:.0f}s\n")
