"""SinkConfig: the one model of a sink's configuration, shared by the job and the operator.

Loaded from YAML or JSON. Secrets never live in it: they are referenced by environment variable
or file and resolved only when a client is built, so the rendered config and logs stay clean.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from .decode import DecoderSpec, Format
from .state_machine import MissingPolicy as MissingPolicy  # re-exported for the job
from .store import Engine

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9_.]{0,118}[a-z0-9])?$")
# Spark's Kafka consumers fetch 1 MB per partition by default, which made reading 3x slower than these
# on the benchmark (bench/README.md); `options` or `sourceOptions` override them.
SOURCE_FETCH_DEFAULTS = {"kafka.max.partition.fetch.bytes": str(16 << 20), "kafka.fetch.max.bytes": str(64 << 20),
                         "kafka.receive.buffer.bytes": str(4 << 20)}
_FORBIDDEN_SOURCE_OPTIONS = {"minpartitions", "maxrecordsperpartition", "assign", "subscribe", "subscribepattern",
                             "startingoffsets", "kafka.group.id", "groupidprefix"}


class ConfigError(ValueError):
    """A configuration problem, phrased for the user: which field, and why."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SecretRef(Strict):
    """A secret value taken from an environment variable or a file (a mounted Kubernetes Secret)."""

    env: str | None = None
    file: str | None = None
    _bound: str | None = PrivateAttr(default=None)

    def bind(self, value: str) -> None:
        """Holds a value in memory only (the operator, which reads Secrets through the API, not env)."""
        self._bound = value

    @model_validator(mode="after")
    def _one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of `env` or `file`")
        return self

    def resolve(self, where: str) -> str:
        if self._bound is not None:
            return self._bound
        if self.env is not None:
            if self.env not in os.environ:
                raise ConfigError(f"{where}: environment variable {self.env} is not set")
            return os.environ[self.env]
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

    @model_validator(mode="after")
    def _topics(self) -> KafkaConfig:
        if not self.topics and not self.topic_pattern:
            raise ValueError("give `topics` (a non-empty list) or `topicPattern`")
        if self.topics and self.topic_pattern:
            raise ValueError("give either `topics` or `topicPattern`, not both")
        if self.topic_pattern:
            re.compile(self.topic_pattern)
        bad = sorted(k for k in self.source_options if k.lower() in _FORBIDDEN_SOURCE_OPTIONS)
        if bad:
            raise ValueError(f"sourceOptions {bad} are managed by chsink (they would split a partition across "
                             "tasks or bypass the state store)")
        return self

    def client_options(self) -> dict[str, str]:
        """Options for confluent-kafka clients (producer, consumer, admin), secrets resolved."""
        out = {"bootstrap.servers": self.bootstrap_servers, **self.options}
        for k, ref in self.secret_options.items():
            out[k] = ref.resolve(f"kafka.secretOptions.{k}")
        return out

    def spark_options(self) -> dict[str, str]:
        """The same options for Spark's Kafka source (prefixed `kafka.`), secrets resolved, with larger
        fetches by default; `sourceOptions` come last and win."""
        return {**SOURCE_FETCH_DEFAULTS, **{f"kafka.{k}": v for k, v in self.client_options().items()},
                **self.source_options}


class ClickHouseConfig(Strict):
    endpoints: list[str] = Field(min_length=1, description="clickhouse-connect DSNs, one per shard")
    database: str = "default"
    tables: dict[str, str] = Field(min_length=1, description="topic -> table; key '*' matches any topic")
    table_field: str | None = Field(default=None, alias="tableField", description="route by this record field")
    table_header: str | None = Field(default=None, alias="tableHeader", description="route by this Kafka header")
    username: str | None = None
    password: SecretRef | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    chdb_config_file: str | None = Field(default=None, alias="chdbConfigFile")

    @field_validator("endpoints")
    @classmethod
    def _dsns(cls, v: list[str]) -> list[str]:
        for i, dsn in enumerate(v):
            if not re.match(r"^(https?|chdb|clickhouse)://", dsn):
                raise ValueError(f"endpoint [{i}] {dsn!r} is not a clickhouse-connect DSN (http://, https://, chdb://)")
        return v

    @property
    def embedded(self) -> bool:
        return self.endpoints[0].startswith("chdb://")

    def table_for(self, topic: str) -> str | None:
        return self.tables.get(topic, self.tables.get("*"))

    @property
    def routed(self) -> bool:
        return bool(self.table_field or self.table_header)


class FormatConfig(Strict):
    type: Literal["json", "avro", "string"] = "json"
    unknown_fields: Literal["ignore", "reject"] = Field(default="ignore", alias="unknownFields")
    avro_schema: str | None = Field(default=None, alias="avroSchema")
    schema_registry_url: str | None = Field(default=None, alias="schemaRegistryUrl")
    max_message_bytes: int = Field(default=8 << 20, alias="maxMessageBytes", gt=0)
    parser: Literal["clickhouse", "python"] = Field(
        default="clickhouse", description="json: ClickHouse parses clean records (fast); python decodes each one")

    @model_validator(mode="after")
    def _avro(self) -> FormatConfig:
        if self.type == "avro" and not (self.avro_schema or self.schema_registry_url):
            raise ValueError("format avro needs `avroSchema` or `schemaRegistryUrl`")
        if self.avro_schema:
            json.loads(self.avro_schema)
        return self

    def decoder_spec(self) -> DecoderSpec:
        return DecoderSpec(Format(self.type), self.unknown_fields, self.avro_schema, self.schema_registry_url,
                           self.max_message_bytes)


class StateConfig(Strict):
    enabled: bool = Field(default=True, description="false: plain at-least-once inserts (benchmark baseline)")
    engine: Engine = Engine.KEEPER_MAP
    table: str = "chsink_state"
    database: str | None = None
    keeper_path: str | None = Field(default=None, alias="keeperPath")


class BatchingConfig(Strict):
    trigger_interval: str = Field(default="2 seconds", alias="triggerInterval")
    max_offsets_per_trigger: int | None = Field(default=200_000, alias="maxOffsetsPerTrigger", gt=0)
    block_offsets: int = Field(default=200_000, alias="blockOffsets", gt=0,
                               description="offsets per INSERT block, counted from each range's start")


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
    checkpoint_location: str = Field(alias="checkpointLocation")
    spark_conf: dict[str, str] = Field(default_factory=dict, alias="sparkConf")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be 1-120 lowercase letters, digits, '-', '_' or '.'")
        return v

    def redacted(self) -> dict[str, Any]:
        """The config as shown in logs: secret references only, never their values."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (("." if out else "") + str(part))
    return out


def parse_config(data: dict[str, Any], source: str = "config") -> SinkConfig:
    """Validates a config dict; errors name each field and the reason."""
    try:
        return SinkConfig.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            path = _field_path(tuple(p for p in err["loc"] if p not in ("function-after",)))
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown field"
            lines.append(f"  {path or '(top level)'}: {msg}")
        raise ConfigError(f"invalid sink config in {source}:\n" + "\n".join(lines)) from None


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
