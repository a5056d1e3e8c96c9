"""The operator's own access to a sink's systems: its config with Secrets bound in memory, its state store."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparkapp.config import SinkConfig
from sparkapp.edges.clickhouse import clickhouse_client
from sparkapp.edges.store import StateStore, state_store

from .kube import secret_values
from .model import SinkSpec
from .render import secret_refs, sink_config

# The operator's own ClickHouse calls read a few state rows. They must not wait out the sink's
# requestTimeoutSeconds (sized for the job's large inserts): a server that hangs without a reset would hold
# the sink's reconcile, and a spec fix behind it, for minutes.
OPERATOR_REQUEST_TIMEOUT_S = 15


def operator_config(namespace: str, name: str, spec: SinkSpec,
                    status: Mapping[str, Any] | None = None) -> SinkConfig:
    """The sink's config with its Secrets bound in memory, for the operator's own state-store and Kafka calls."""
    cfg = sink_config(namespace, name, spec, status)
    values = secret_values(namespace, secret_refs(spec))
    for ref in (cfg.clickhouse.password, *cfg.kafka.secret_options.values()):
        if ref is not None and ref.variables and all(v in values for v in ref.variables):
            ref.bind("\n".join(values[v].strip() for v in ref.variables))  # as SecretRef.resolve joins them
    return cfg


def open_store(cfg: SinkConfig) -> StateStore:
    ch = cfg.clickhouse.model_copy(update={"request_timeout_s": min(cfg.clickhouse.request_timeout_s,
                                                                     OPERATOR_REQUEST_TIMEOUT_S)})
    store = state_store(cfg, clickhouse_client(ch))
    store.ensure_schema()
    return store
