"""Session-scoped fixtures over the real test bed. Each server starts once, on loopback, on free ports."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hack.testbed import Etcd, Kafka, KubeApiServer, ZooKeeper, cached, scratch_env, spark_session, versions
from hack.testbed.process import await_provisioning
from hack.testbed.servers import ClickHouseServer, SchemaRegistry


def pytest_configure(config: pytest.Config) -> None:
    """Every temporary file of the run, this process's and its children's (Spark's block managers and
    unpacked native libraries, chdb's insert buffers), goes under the run's basetemp, never /tmp."""
    import tempfile

    base = Path(config.option.basetemp or tempfile.mkdtemp(prefix="chsink-tests-")).resolve()
    os.environ.update(scratch_env(base / "scratch", short_lived=True))
    tempfile.tempdir = None  # recomputed from TMPDIR


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test` runs two pytest workers (pytest-xdist): most of a test's time is a JVM starting, a job waiting
    for its batches or a server restarting, not CPU. Each worker starts its own servers (free ports, its own
    basetemp). A test file stays on one worker, in its order; the node's tests share one worker, as they share the
    machine's container runtime, network namespaces and iptables."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_scope(nodeid)

    return ByFile(config, log)


def worker_scope(nodeid: str) -> str:
    """What one worker runs whole: the test's file, or the node's tests together."""
    path = nodeid.split("::", 1)[0]
    return "tests/node" if path.startswith("tests/node/") else path


# The fixtures whose parts the background build of `make test` makes (hack/setup.sh test: the Kubernetes binaries
# and the images, about 25 minutes on a fresh machine beside the tests).
LATE_FIXTURES = frozenset({"kube", "empty_cluster", "node", "promtool"})
_LATE_SCOPES = pytest.StashKey[frozenset[str]]()


def late_last(nodeids: list[str], fixtures: list[set[str]]) -> tuple[list[int], frozenset[str]]:
    """The run's order, as indexes into `nodeids`: every worker scope that needs the background build after every
    one that does not, each kept whole and in its order, so the build has the longest time to end before a test
    waits for it; and those scopes."""
    late = frozenset(worker_scope(n) for n, f in zip(nodeids, fixtures, strict=True) if f & LATE_FIXTURES)
    return sorted(range(len(nodeids)), key=lambda i: worker_scope(nodeids[i]) in late), late


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    order, late = late_last([i.nodeid for i in items], [set(getattr(i, "fixturenames", ())) for i in items])
    items[:] = [items[i] for i in order]
    config.stash[_LATE_SCOPES] = late


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """A test of a scope that needs the background build waits for it before its own timeout starts: waiting for
    the test bed's build is no test's time (on a fresh machine the first such test waited past its 900 s)."""
    if worker_scope(item.nodeid) in item.config.stash.get(_LATE_SCOPES, frozenset()):
        await_provisioning()
    return (yield)


@pytest.fixture(scope="session", autouse=True)
def scratch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pytest empties --basetemp when it first hands out a temporary path, after pytest_configure made the scratch
    directory in it; made again here, before any test, or a run's first temporary file fails (chdb's, Spark's)."""
    tmp_path_factory.getbasetemp()
    scratch = Path(os.environ["TMPDIR"])
    (scratch / "spark-local").mkdir(parents=True, exist_ok=True)
    return scratch


@pytest.fixture(scope="session")
def testbed_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("testbed")


@pytest.fixture(scope="session")
def zookeeper(testbed_dir: Path) -> Iterator[ZooKeeper]:
    with ZooKeeper(testbed_dir / "zookeeper") as zk:
        yield zk  # type: ignore[misc]


@pytest.fixture(scope="session")
def kafka(testbed_dir: Path) -> Iterator[Kafka]:
    with Kafka(testbed_dir / "kafka") as k:
        yield k  # type: ignore[misc]


@pytest.fixture(scope="session")
def schema_registry(testbed_dir: Path) -> Iterator[SchemaRegistry]:
    """A Confluent-compatible schema registry (Apicurio's, in memory) for the session."""
    with SchemaRegistry(testbed_dir / "schema-registry") as r:
        yield r  # type: ignore[misc]


_topic_seq = itertools.count()


@pytest.fixture
def topic(kafka: Kafka, request: pytest.FixtureRequest) -> Callable[..., str]:
    """Creates a fresh topic with N partitions and returns its name."""

    def make(partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = f"t{next(_topic_seq)}-{request.node.name[:40]}".replace("[", "-").replace("]", "")
        kafka.create_topic(name, partitions, config)
        return name

    return make


@pytest.fixture(scope="session")
def clickhouse_server(zookeeper: ZooKeeper, testbed_dir: Path) -> Iterator[ClickHouseServer]:
    """One real ClickHouse server process for the session (HTTP and native TCP on loopback, KeeperMap on the
    test bed's ZooKeeper); a test that kills it starts it again before it ends."""
    server = ClickHouseServer(testbed_dir / "clickhouse", zookeeper)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def clickhouse_shards(clickhouse_server: ClickHouseServer, testbed_dir: Path) -> Iterator[list[ClickHouseServer]]:
    """Three ClickHouse server processes, one per shard: the session's server and two more."""
    more = [ClickHouseServer(testbed_dir / f"clickhouse-shard{i}") for i in (1, 2)]
    try:
        for server in more:
            server.start()
        yield [clickhouse_server, *more]
    finally:
        for server in more:
            server.stop()


@pytest.fixture(scope="session")
def chdb_config(zookeeper: ZooKeeper, testbed_dir: Path) -> Path:
    return zookeeper.clickhouse_config(testbed_dir / "clickhouse-config.xml")


@pytest.fixture(scope="session")
def chdb_path(testbed_dir: Path) -> Path:
    """chdb serves one path per process: every test in this session shares it, one database each."""
    return testbed_dir / "chdb"


@pytest.fixture(scope="session")
def ch_dsn(chdb_path: Path) -> str:
    return f"chdb://{chdb_path}"


@pytest.fixture(scope="session")
def ch_factory(ch_dsn: str, chdb_config: Path) -> Callable[..., Any]:
    """Builds clickhouse-connect clients on the session's chdb engine, configured for ZooKeeper."""
    import clickhouse_connect

    def make(database: str | None = None) -> Any:
        client = clickhouse_connect.get_client(dsn=ch_dsn, chdb_options={"config-file": str(chdb_config)})
        if database:
            client.command(f"CREATE DATABASE IF NOT EXISTS `{database}`")
            client.database = database
        return client

    return make


_db_seq = itertools.count()


@pytest.fixture
def ch_db(ch_factory: Callable[..., Any]) -> Iterator[tuple[Any, str]]:
    """A fresh database on the shared chdb engine, dropped afterwards."""
    name = f"db{os.getpid()}_{next(_db_seq)}"
    client = ch_factory(name)
    yield client, name
    client.command(f"DROP DATABASE IF EXISTS `{name}` SYNC")


@dataclass
class Kube:
    api: KubeApiServer
    kubeconfig: Path

    def kubectl(self, *args: str, **kw: Any) -> Any:
        return self.api.run_kubectl(*args, **kw)

    def client(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(str(self.kubeconfig))


@pytest.fixture(scope="session")
def kube(testbed_dir: Path) -> Iterator[Kube]:
    with Etcd(testbed_dir / "etcd") as etcd, KubeApiServer(testbed_dir / "apiserver", etcd) as api:  # type: ignore[arg-type]
        assert isinstance(api, KubeApiServer)
        crds = cached(f"spark-operator-crds-{versions()['SPARK_OPERATOR_VERSION']}")
        for f in sorted(crds.glob("*.yaml")):
            api.run_kubectl("apply", "--server-side", "-f", str(f))
        api.wait_crd("sparkapplications.sparkoperator.k8s.io")
        yield Kube(api, api.kubeconfig)


@pytest.fixture(scope="session")
def empty_cluster(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Any]:
    """A second API server on the session's etcd under its own prefix: a cluster as a new user has it,
    with nothing installed (no CRDs, no spark-operator), for a few seconds' start instead of another etcd."""
    import contextlib

    @contextlib.contextmanager
    def start(name: str) -> Iterator[KubeApiServer]:
        with KubeApiServer(tmp_path_factory.mktemp(f"apiserver-{name}"), kube.api.etcd,
                           etcd_prefix=f"/{name}") as api:
            assert isinstance(api, KubeApiServer)
            yield api

    return start


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = spark_session()
    yield session
    session.stop()
