"""SinkConfig: the one model of a sink's configuration, shared by the job and the operator.

Loaded from YAML or JSON. Secrets never live in it: they are referenced by environment variable
or file and resolved only when a client is built, so the rendered config and logs stay clean.
"""

from __future__ import annotations

import enum
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from .core.kafka_options import KafkaOptionError, java_consumer_options
from .core.routing import DEFAULT_STRIPE, HashName, Layout, Policy, parse_assignment
from .formats.protobuf import check as check_protobuf
from .formats.record_key import KeyFormat
from .formats.registry import DecoderSpec, Format

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9_.]{0,118}[a-z0-9])?$")
# Spark's Kafka consumers fetch 1 MB per partition by default, which made reading 3x slower than these
# on the benchmark (bench/README.md). A micro-batch that reads up to the end of the log (the last of a
# catch-up, or any at the head of a topic) waited on fetches the broker parks for `fetch.max.wait.ms` (500 ms by
# default) when it has nothing newer: about 1.5 s more for such a batch in the benchmark, none at 50 ms, with
# no more broker CPU per row. `options` or `sourceOptions` override them.
SOURCE_FETCH_DEFAULTS = {"kafka.max.partition.fetch.bytes": str(16 << 20), "kafka.fetch.max.bytes": str(64 << 20),
                         "kafka.receive.buffer.bytes": str(4 << 20), "kafka.fetch.max.wait.ms": "50"}
_FORBIDDEN_SOURCE_OPTIONS = {"minpartitions", "maxrecordsperpartition", "assign", "subscribe", "subscribepattern",
                             "startingoffsets", "kafka.group.id", "groupidprefix", "kafka.isolation.level"}
# Every reader (Spark's source, re-reads, the verifier) sees committed records only: Spark's consumer would
# otherwise read aborted records and those of open transactions as data.
READ_COMMITTED = {"isolation.level": "read_committed"}
# The JVMs' garbage collector. Spark's Kafka source copies every record several times; under the throughput
# collector it spent less CPU per row than under G1 (Java's default) in every benchmark run, and the driver
# JVM's peak memory was lower (bench/HISTORY.md). A collector named in the role's options (its own or
# Spark's default ones) is kept alone: the JVM refuses two.
JVM_COLLECTOR = "-XX:+UseParallelGC"
_NAMES_COLLECTOR = re.compile(r"-XX:[+]Use\w+GC\b")


def with_jvm_defaults(conf: Mapping[str, str]) -> dict[str, str]:
    """`conf` with JVM_COLLECTOR added to the driver's and the executors' JVM options that name no collector."""
    out = dict(conf)
    for role in ("driver", "executor"):
        key = f"spark.{role}.extraJavaOptions"
        opts = out.get(key, "")
        if not _NAMES_COLLECTOR.search(f"{out.get(f'spark.{role}.defaultJavaOptions', '')} {opts}"):
            out[key] = f"{JVM_COLLECTOR} {opts}".strip()
    return out


# a checkpoint location chsink uses holds this file, naming the sink: another sink cannot take it over, and
# the operator's deletionPolicy Delete removes only what chsink wrote there, only when it names the sink
CHECKPOINT_MARKER = "_chsink_sink"
# what chsink and Spark write under a checkpoint location (runs of the pipelined path are run-<epoch>)
CHECKPOINT_ENTRIES = frozenset({"offsets", "commits", "metadata", "sources", "state", "metadata.crc"})


def is_local_path(location: str, default_fs: str) -> bool:
    """Whether Hadoop resolves `location` to the local file system: `file:`, or no scheme and a local default."""
    def scheme(uri: str) -> str:
        m = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", uri)
        return m.group(1).lower() if m else ""

    return (scheme(location) or scheme(default_fs) or "file") == "file"


class Engine(enum.Enum):
    """The state table's engine: KeeperMap (cluster-wide, in Keeper) or EmbeddedRocksDB (one node)."""

    KEEPER_MAP = "KeeperMap"
    ROCKSDB = "EmbeddedRocksDB"


class ConfigError(ValueError):
    """A configuration problem, phrased for the user: which field, and why."""


class UnavailableError(Exception):
    """A system the sink needs did not answer now (network, a restart, a topic not created yet): worth trying
    again, unlike a ConfigError, which only a change to the config fixes."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SecretRef(Strict):
    """A secret value taken from an environment variable or a file (a mounted Kubernetes Secret)."""

    env: str | None = None
    file: str | None = None
    envs: list[str] | None = Field(default=None, min_length=1,
                                   description="several environment variables, their values joined by newlines "
                                               "(PEM certificates from several Secrets)")
    _bound: str | None = PrivateAttr(default=None)

    def bind(self, value: str) -> None:
        """Holds a value in memory only (the operator, which reads Secrets through the API, not env)."""
        self._bound = value

    @model_validator(mode="after")
    def _one(self) -> SecretRef:
        if sum((self.env is not None, self.file is not None, self.envs is not None)) != 1:
            raise ValueError("give exactly one of `env`, `envs` or `file`")
        return self

    @property
    def variables(self) -> list[str]:
        """The environment variables it reads."""
        return [self.env] if self.env is not None else list(self.envs or ())

    def resolve(self, where: str) -> str:
        if self._bound is not None:
            return self._bound
        if self.variables:
            unset = [v for v in self.variables if v not in os.environ]
            if unset:
                raise ConfigError(f"{where}: environment variable(s) {', '.join(unset)} not set")
            return "\n".join(os.environ[v].strip() for v in self.variables)
        path = Path(self.file or "")
        try:
            return path.read_text().strip()
        except OSError as e:
            raise ConfigError(f"{where}: cannot read secret file {path}: {e.strerror}") from None


class KafkaConfig(Strict):
    bootstrap_servers: str = Field(alias="bootstrapServers", min_length=1)
    topics: list[str] = Field(default_factory=list)
    topic_pattern: str | None = Field(default=None, alias="topicPattern")
    options: dict[str, str] = Field(default_factory=dict, description="Kafka client options, e.g. security.protocol")
    secret_options: dict[str, SecretRef] = Field(default_factory=dict, alias="secretOptions")
    source_options: dict[str, str] = Field(default_factory=dict, alias="sourceOptions")
    starting_offsets: Literal["earliest", "latest"] | dict[str, dict[int, int]] = Field(
        default="earliest", alias="startingOffsets",
        description="where a sink without any state starts: earliest, latest, or {topic: {partition: offset}} "
                    "(others earliest); ignored once the state store holds the sink's positions")
    acknowledge_redelivery: bool = Field(
        default=False, alias="acknowledgeRedelivery",
        description="start a sink without state from the earliest offset although its tables already hold rows "
                    "of its topics (a re-created sink): those are delivered again")
    credentials_from: str | None = Field(
        default=None, alias="credentialsFrom",
        description="where the security options come from, as a refused connection names it (the operator sets it: "
                    "the ClickHouseSink's fields and Secrets)")
    consumer_group: str | None = Field(
        default=None, alias="consumerGroup", min_length=1, max_length=255,
        description="a Kafka consumer group told, every few seconds, where each partition is delivered to, for the "
                    "tools that read lag there (KEDA's Kafka scaler, Burrow, kafka-exporter); for monitoring only: "
                    "never read back, the state store decides where the sink resumes")

    @model_validator(mode="after")
    def _topics(self) -> KafkaConfig:
        if not self.topics and not self.topic_pattern:
            raise ValueError("give `topics` (a non-empty list) or `topicPattern`")
        if self.topics and self.topic_pattern:
            raise ValueError("give either `topics` or `topicPattern`, not both")
        if self.topic_pattern:
            try:
                re.compile(self.topic_pattern)
            except re.error as e:
                raise ValueError(f"topicPattern {self.topic_pattern!r} is not a regular expression: {e}") from None
        if self.options.get("isolation.level", "read_committed") != "read_committed":
            raise ValueError("options isolation.level: chsink reads read_committed only (aborted records are not data)")
        try:  # the Java consumer's view of the options, secrets not resolved yet
            java_consumer_options({**self.options, **{k: "" for k in self.secret_options}}, self._java_given)
        except KafkaOptionError as e:
            raise ValueError(f"options: {e}") from None
        if isinstance(self.starting_offsets, dict):
            for t, offsets in self.starting_offsets.items():
                if self.topics and t not in self.topics:
                    raise ValueError(f"startingOffsets names topic {t!r}, which is not in `topics`")
                if any(o < 0 or p < 0 for p, o in offsets.items()):
                    raise ValueError(f"startingOffsets[{t!r}]: partitions and offsets are >= 0, got {offsets}")
        bad = sorted(k for k in self.source_options if k.lower() in _FORBIDDEN_SOURCE_OPTIONS)
        if bad:
            raise ValueError(f"sourceOptions {bad} are managed by chsink (they would split a partition across "
                             "tasks or bypass the state store)")
        return self

    @property
    def fail_on_data_loss(self) -> bool:
        """Spark's `failOnDataLoss` (default true): records deleted before delivery stop the run."""
        opts = {k.lower(): v for k, v in self.source_options.items()}
        return opts.get("failondataloss", "true").strip().lower() != "false"

    def client_options(self) -> dict[str, str]:
        """Options for confluent-kafka clients (producer, consumer, admin), secrets resolved."""
        out = {"bootstrap.servers": self.bootstrap_servers, **self.options}
        for k, ref in self.secret_options.items():
            out[k] = ref.resolve(f"kafka.secretOptions.{k}")
        return out

    @property
    def _java_given(self) -> list[str]:
        return [k.removeprefix("kafka.") for k in self.source_options if k.startswith("kafka.")]

    def spark_options(self) -> dict[str, str]:
        """The same options for Spark's Kafka source (prefixed `kafka.`, security in the Java client's names),
        secrets resolved, with larger fetches by default; `sourceOptions` come last and win."""
        java = java_consumer_options(self.client_options(), self._java_given)
        return {**SOURCE_FETCH_DEFAULTS, **{f"kafka.{k}": v for k, v in java.items()},
                **self.source_options, **{f"kafka.{k}": v for k, v in READ_COMMITTED.items()}}


class ClickHouseConfig(Strict):
    endpoints: list[str] = Field(min_length=1, description="clickhouse-connect DSNs, one per shard")
    database: str = "default"
    shard_databases: list[str] = Field(default_factory=list, alias="shardDatabases",
                                       description="per shard, a database other than `database` (empty: all alike)")
    tables: dict[str, str] = Field(min_length=1, description="topic -> table; key '*' matches any topic")
    table_field: str | None = Field(default=None, alias="tableField", description="route by this record field")
    table_header: str | None = Field(default=None, alias="tableHeader", description="route by this Kafka header")
    username: str | None = None
    password: SecretRef | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    request_timeout_s: int = Field(
        default=300, alias="requestTimeoutSeconds", gt=0,
        description="how long one HTTP request may wait for ClickHouse's reply; a shard that hangs (no reset) "
                    "stalls its partitions after the insert retries, so this bounds how long it holds a batch")
    chdb_config_file: str | None = Field(default=None, alias="chdbConfigFile")

    @field_validator("endpoints")
    @classmethod
    def _dsns(cls, v: list[str]) -> list[str]:
        for i, dsn in enumerate(v):
            if not re.match(r"^(https?|chdb|clickhouse)://", dsn):
                raise ValueError(f"endpoint [{i}] {dsn!r} is not a clickhouse-connect DSN (http://, https://, chdb://)")
        return v

    @model_validator(mode="after")
    def _shard_dbs(self) -> ClickHouseConfig:
        if self.shard_databases and len(self.shard_databases) != len(self.endpoints):
            raise ValueError(f"shardDatabases has {len(self.shard_databases)} entries for "
                             f"{len(self.endpoints)} endpoints; give one per endpoint or none")
        return self

    @model_validator(mode="after")
    def _one_router(self) -> ClickHouseConfig:
        if self.table_field and self.table_header:
            raise ValueError("give tableField or tableHeader, not both: a record's table comes from one of them")
        return self

    @property
    def embedded(self) -> bool:
        return self.endpoints[0].startswith("chdb://")

    def shard_database(self, shard: int) -> str:
        return self.shard_databases[shard] if self.shard_databases else self.database

    def table_for(self, topic: str) -> str | None:
        return self.tables.get(topic, self.tables.get("*"))

    @property
    def routed(self) -> bool:
        return bool(self.table_field or self.table_header)


class FormatConfig(Strict):
    type: Format = Format.JSON
    unknown_fields: Literal["ignore", "reject"] = Field(default="ignore", alias="unknownFields")
    avro_schema: str | None = Field(default=None, alias="avroSchema")
    schema_registry_url: str | None = Field(default=None, alias="schemaRegistryUrl")
    max_message_bytes: int = Field(default=8 << 20, alias="maxMessageBytes", gt=0)
    parser: Literal["clickhouse", "python"] = Field(
        default="clickhouse", description="json: ClickHouse parses clean records (fast); python decodes each one")
    envelope: Literal["none", "debezium", "upsert"] = Field(
        default="none", description="debezium: each value is a change event, stored as its row with _op, _deleted; "
                                    "upsert: a value is its key's row, a tombstone the key's delete (_deleted 1)")
    key_format: KeyFormat = Field(
        default=KeyFormat.NONE, alias="keyFormat",
        description="json or avro: the record key's fields fill columns (over the value's); none: only `_key`")
    key_avro_schema: str | None = Field(
        default=None, alias="keyAvroSchema", description="keyFormat avro: the key's writer schema, without a registry")
    protobuf_descriptor_set: str | None = Field(
        default=None, alias="protobufDescriptorSet",
        description="protobuf: a FileDescriptorSet as base64 (protoc --include_imports --descriptor_set_out)")
    protobuf_message: str | None = Field(
        default=None, alias="protobufMessage",
        description="protobuf with a descriptor set: the full name of the message each value is")
    add_columns: bool = Field(
        default=False, alias="addColumns",
        description="a record field no column takes adds a Nullable column to the table (schema evolution)")

    @model_validator(mode="after")
    def _avro(self) -> FormatConfig:
        if self.type is Format.AVRO and not (self.avro_schema or self.schema_registry_url):
            raise ValueError("format avro needs `avroSchema` or `schemaRegistryUrl`")
        if self.avro_schema:
            json.loads(self.avro_schema)
        if self.envelope == "debezium" and self.type is Format.STRING:
            raise ValueError("envelope debezium needs a record format (json, avro or protobuf), not string")
        if self.key_format is KeyFormat.AVRO and not (self.key_avro_schema or self.schema_registry_url):
            raise ValueError("keyFormat avro needs `keyAvroSchema` or `schemaRegistryUrl`")
        if self.key_avro_schema:
            json.loads(self.key_avro_schema)
        return self

    @model_validator(mode="after")
    def _protobuf(self) -> FormatConfig:
        given = self.protobuf_descriptor_set is not None, self.protobuf_message is not None
        if self.type is Format.PROTOBUF:
            if not (all(given) or self.schema_registry_url):
                raise ValueError("format protobuf needs `protobufDescriptorSet` with `protobufMessage`, or "
                                 "`schemaRegistryUrl`")
            if any(given) and not all(given):
                raise ValueError("`protobufDescriptorSet` and `protobufMessage` go together: the set holds the "
                                 "message's type, the name says which of its messages each value is")
            if all(given):
                check_protobuf(self.protobuf_descriptor_set or "", self.protobuf_message or "")
        elif any(given):
            raise ValueError("`protobufDescriptorSet` and `protobufMessage` are for format protobuf")
        return self

    @property
    def clickhouse_parses(self) -> bool:
        """Whether ClickHouse can parse the records itself (the fast path): JSON values that are the rows as they
        are, nothing taken from the key, no column to add first."""
        return self.type is Format.JSON and self.parser == "clickhouse" and self.envelope == "none" \
            and self.key_format is KeyFormat.NONE and not self.add_columns

    @property
    def tombstones_hold_no_row(self) -> bool:
        return self.decoder_spec().tombstones_hold_no_row

    def decoder_spec(self) -> DecoderSpec:
        return DecoderSpec(self.type, self.unknown_fields, self.avro_schema, self.schema_registry_url,
                           self.max_message_bytes, self.envelope, self.key_format, self.key_avro_schema,
                           self.protobuf_descriptor_set, self.protobuf_message)


class StateConfig(Strict):
    enabled: bool = Field(default=True, description="false: plain at-least-once inserts (benchmark baseline)")
    engine: Engine = Engine.KEEPER_MAP
    table: str = "chsink_state"
    database: str | None = None
    keeper_path: str | None = Field(default=None, alias="keeperPath")


# what Spark's ProcessingTime trigger reads: a whole number and a unit, e.g. "2 seconds", "500 milliseconds"
TRIGGER_INTERVAL = re.compile(r"(?i)^\s*[0-9]+\s+(millisecond|second|minute|hour|day)s?\s*$")


class BatchingConfig(Strict):
    trigger_interval: str = Field(default="2 seconds", alias="triggerInterval", pattern=TRIGGER_INTERVAL.pattern)
    max_offsets_per_trigger: int | None = Field(default=200_000, alias="maxOffsetsPerTrigger", gt=0)
    block_offsets: int = Field(default=200_000, alias="blockOffsets", gt=0,
                               description="offsets per INSERT block, counted from each range's start")


class PreviousLayout(Strict):
    """The shard layout before the current one: a BEFORE range recorded under it is re-sent under it."""

    layout: int = Field(ge=0)
    endpoints: list[str] = Field(min_length=1)
    shard_databases: list[str] = Field(default_factory=list, alias="shardDatabases")
    weights: list[int] = Field(default_factory=list)
    assignment: dict[str, int] = Field(default_factory=dict)
    policy: Policy | None = Field(default=None, description="when it differed from the current layout's")
    key: str | None = None
    hash: HashName | None = None
    stripe: int | None = Field(default=None, gt=0)


class ShardingConfig(Strict):
    """How rows are spread over `clickhouse.endpoints`; the policies are in sparkapp/core/routing.py."""

    policy: Policy = Policy.PARTITION
    key: str | None = Field(default=None, description="policy key: the column hashed, as the Distributed table does")
    hash: HashName = HashName.XXHASH64
    weights: list[int] = Field(default_factory=list, description="per shard (default 1 each)")
    stripe: int = Field(default=DEFAULT_STRIPE, gt=0, description="policy offsetStripe: offsets per stripe")
    layout: int = Field(default=0, ge=0, description="layout version, recorded in every state row")
    assignment: dict[str, int] = Field(
        default_factory=dict, description="policy partition: 'topic/partition' -> shard; others by hash")
    previous: PreviousLayout | None = None

    @model_validator(mode="after")
    def _check(self) -> ShardingConfig:
        if self.policy is Policy.KEY and not self.key:
            raise ValueError("policy key needs `key` (the column to hash)")
        if any(w < 1 for w in self.weights):
            raise ValueError("weights must be positive integers")
        parse_assignment(self.assignment)
        if self.previous is not None and self.previous.layout >= self.layout:
            raise ValueError(f"previous.layout {self.previous.layout} must be below layout {self.layout}")
        return self


def _layout(version: int, shards: int, weights: list[int], assignment: dict[str, int], policy: Policy,
            key: str | None, hash_name: HashName, stripe: int, type_of: Callable[[str], str]) -> Layout:
    parsed = parse_assignment(assignment)
    layout = Layout(version, tuple(weights or [1] * shards), policy, hash_name, "", stripe, parsed, key or "")
    return replace(layout, key_type=type_of(key)) if layout.needs_key and key else layout


class DlqConfig(Strict):
    topic: str | None = None


class SinkConfig(Strict):
    name: str = Field(description="the sink id: namespaces state rows and dedup tokens")
    kafka: KafkaConfig
    clickhouse: ClickHouseConfig
    format: FormatConfig = Field(default_factory=FormatConfig)
    state: StateConfig = Field(default_factory=StateConfig)
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    dlq: DlqConfig = Field(default_factory=DlqConfig)
    sharding: ShardingConfig = Field(default_factory=ShardingConfig)
    checkpoint_location: str = Field(alias="checkpointLocation")
    spark_conf: dict[str, str] = Field(default_factory=dict, alias="sparkConf")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be 1-120 lowercase letters, digits, '-', '_' or '.', beginning and ending with a "
                             "letter or digit")
        return v

    @model_validator(mode="after")
    def _sharding(self) -> SinkConfig:
        sh, n = self.sharding, len(self.clickhouse.endpoints)
        if sh.weights and len(sh.weights) != n:
            raise ValueError(f"sharding.weights has {len(sh.weights)} entries for {n} clickhouse endpoints")
        bad = {tp: s for tp, s in sh.assignment.items() if s >= n}
        if bad:
            raise ValueError(f"sharding.assignment names shards beyond the {n} endpoints: {bad}")
        dlq = self.dlq.topic
        if dlq and (dlq in self.kafka.topics or (self.kafka.topic_pattern and
                                                  re.fullmatch(self.kafka.topic_pattern, dlq))):
            raise ValueError(f"dlq.topic {dlq!r} is one of the sink's own source topics: a dead-lettered record "
                             "would be read back and dead-lettered again, forever")
        prev = sh.previous
        if prev is not None:
            if prev.weights and len(prev.weights) != len(prev.endpoints):
                raise ValueError("sharding.previous.weights must have one entry per previous endpoint")
            if prev.shard_databases and len(prev.shard_databases) != len(prev.endpoints):
                raise ValueError("sharding.previous.shardDatabases must have one entry per previous endpoint")
        return self

    def layouts(self, type_of: Callable[[str], str] = lambda column: "") -> dict[int, Layout]:
        """The pure routing layouts this config describes: the current one and, if given, the previous.
        `type_of` gives the ClickHouse type of a key column (policy key)."""
        sh = self.sharding
        out = {sh.layout: _layout(sh.layout, len(self.clickhouse.endpoints), sh.weights, sh.assignment, sh.policy,
                                  sh.key, sh.hash, sh.stripe, type_of)}
        if sh.previous is not None:
            p = sh.previous
            out[p.layout] = _layout(p.layout, len(p.endpoints), p.weights, p.assignment, p.policy or sh.policy,
                                    p.key or sh.key, p.hash or sh.hash, p.stripe or sh.stripe, type_of)
        return out

    def shard_targets(self, layout: int) -> list[tuple[str, str]]:
        """(endpoint, database) of each shard of the current or previous layout."""
        sh, ch = self.sharding, self.clickhouse
        if layout == sh.layout:
            return [(e, ch.shard_database(i)) for i, e in enumerate(ch.endpoints)]
        if sh.previous is not None and layout == sh.previous.layout:
            p = sh.previous
            return [(e, p.shard_databases[i] if p.shard_databases else ch.database) for i, e in enumerate(p.endpoints)]
        raise KeyError(layout)

    def shard_target(self, layout: int, shard: int) -> tuple[str, str]:
        return self.shard_targets(layout)[shard]

    def all_shard_targets(self) -> list[tuple[str, str]]:
        """Every (endpoint, database) rows may be on: the current layout's shards and the previous layout's."""
        out: list[tuple[str, str]] = []
        for v in self.layouts():
            out += [t for t in self.shard_targets(v) if t not in out]
        return out

    def redacted(self) -> dict[str, Any]:
        """The config as shown in logs: secret references only, never their values."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (("." if out else "") + str(part))
    return out


def validation_lines(e: ValidationError, prefix: str = "") -> list[str]:
    """One line per error, naming the field (under `prefix`) and the reason."""
    lines = []
    for err in e.errors():
        path = _field_path(((prefix,) if prefix else ()) + tuple(p for p in err["loc"] if p != "function-after"))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif err["type"] == "string_pattern_mismatch" and path.endswith("triggerInterval"):
            msg = f"{err['input']!r} is not a duration such as '2 seconds', '500 milliseconds' or '1 minute'"
        lines.append(f"  {path or '(top level)'}: {msg}")
    return lines


def parse_config(data: dict[str, Any], source: str = "config", prefix: str = "") -> SinkConfig:
    """Validates a config dict; errors name each field (under `prefix`) and the reason."""
    try:
        return SinkConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"invalid sink config in {source}:\n" + "\n".join(validation_lines(e, prefix))) from None


def load_config(path: str | Path) -> SinkConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config {p}: {e.strerror}") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise ConfigError(f"config {p} is not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {p} must be a mapping at the top level")
    return parse_config(data, str(p))
