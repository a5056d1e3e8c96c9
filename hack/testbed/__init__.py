"""The real test bed: server processes and helpers shared by the pytest fixtures and `make demo`."""

from .process import ManagedProcess, TestbedError, cache_dir, cached, free_port, scratch_env, versions
from .servers import Etcd, Kafka, KubeApiServer, ZooKeeper
from .spark import spark_session

__all__ = [
    "Etcd", "Kafka", "KubeApiServer", "ManagedProcess", "TestbedError", "ZooKeeper",
    "cache_dir", "cached", "free_port", "scratch_env", "spark_session", "versions",
]
