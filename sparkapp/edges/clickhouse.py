"""ClickHouse clients from the sink config (HTTP in executors, chdb in one process) and target-table schemas."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..config import ClickHouseConfig, ConfigError, UnavailableError
from ..formats.schema import AtInsert, SchemaError, TableSchema, build_schema
from .errors import first_line, is_transient

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

_CHDB_CLIENTS: dict[tuple[str, str | None], Client] = {}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class EndpointUnreachableError(UnavailableError):
    """The endpoint did not answer (network, a restart): worth trying again, unlike a wrong address or password."""


class ClickHouseRejectedError(ConfigError):
    """The endpoint answered and refused (a wrong password, user or address): the config, or a Secret, is wrong."""


def redact_dsn(dsn: str) -> str:
    return re.sub(r"://([^:@/]+):[^@/]*@", r"://\1:***@", dsn)


def clickhouse_client(cfg: ClickHouseConfig, endpoint: str | None = None) -> Client:
    """A client for one endpoint (default: the first); connection problems become ConfigError."""
    import clickhouse_connect

    dsn = endpoint or cfg.endpoints[0]
    try:
        if dsn.startswith("chdb://"):
            key = (dsn, cfg.chdb_config_file)
            if key not in _CHDB_CLIENTS:
                opts = {"config-file": cfg.chdb_config_file} if cfg.chdb_config_file else None
                _CHDB_CLIENTS[key] = clickhouse_connect.get_client(dsn=dsn, chdb_options=opts)
            client = _CHDB_CLIENTS[key]
        else:
            password = cfg.password.resolve("clickhouse.password") if cfg.password else None
            # no session: ClickHouse runs one request per session at a time, and a request this client gave
            # up on (a timeout against a hung shard) keeps running when the shard resumes, so every retry and
            # recovery count on the same session would be refused (SESSION_IS_LOCKED). chsink keeps no
            # session state: every setting travels with its request
            kw: dict[str, Any] = {"dsn": dsn, "connect_timeout": 10, "autogenerate_session_id": False,
                                  "send_receive_timeout": cfg.request_timeout_s}
            if cfg.username:
                kw["username"] = cfg.username
            if password is not None:
                kw["password"] = password
            client = clickhouse_connect.get_client(**kw)
        client.command(f"CREATE DATABASE IF NOT EXISTS `{cfg.database}`")
        client.database = cfg.database
        return client
    except ConfigError:
        raise
    except Exception as e:
        first = first_line(e)
        kind: type[Exception] = EndpointUnreachableError if is_transient(e) else ClickHouseRejectedError
        raise kind(f"cannot reach ClickHouse endpoint {redact_dsn(dsn)}: {first}") from None


# Functions whose result ClickHouse computes anew each time, for servers whose system.functions has no
# `deterministic` column: a DEFAULT using one is computed at each insert (formats/schema.AtInsert)
_VOLATILE_NAMES = re.compile(r"^(rand|random|generate|now|today|yesterday|uptime|hostname|fqdn|serveruuid|current|"
                             r"timezone|version|blocknumber|rownumberin|fuzzbits)", re.I)
_CALL = re.compile(r"([A-Za-z_]\w*)\s*\(")


def _volatile(client: Client) -> Callable[[str], bool]:
    """Whether a function (by name) gives another result each time it runs, as ClickHouse itself says."""
    try:
        names = {str(r[0]).lower() for r in client.query("SELECT name FROM system.functions "
                                                         "WHERE deterministic = 0").result_rows}
    except Exception:  # an older server
        return lambda name: bool(_VOLATILE_NAMES.match(name))
    return lambda name: name.lower() in names


def default_values(client: Client, expr: str, n: int) -> list[Any]:
    """n values of a DEFAULT expression as ClickHouse computes them now (one query: now() once, rand() per row),
    each as the decoder's converter takes it: a date-time naming no zone as the instant ClickHouse meant."""
    values = [r[0] for r in client.query(f"SELECT {expr} FROM numbers({n})").result_rows]
    if values and isinstance(values[0], dt.datetime) and values[0].tzinfo is None:  # naive: in which zone? ask for
        micros = client.query(f"SELECT toUnixTimestamp64Micro(toDateTime64({expr}, 6)) FROM numbers({n})")
        values = [_EPOCH + dt.timedelta(microseconds=m) for (m,) in micros.result_rows]  # the instants
    return values


def load_schema(client: Client, database: str, table: str) -> TableSchema:
    """Reads the table's columns; constant DEFAULT expressions are evaluated once by ClickHouse, the others are
    left to ClickHouse at each insert."""
    res = client.query(
        "SELECT name, type, default_kind, default_expression FROM system.columns "
        "WHERE database = {db:String} AND table = {t:String} ORDER BY position",
        parameters={"db": database, "t": table},
    )
    if not res.result_rows:
        raise SchemaError(
            f"target table `{database}`.`{table}` does not exist (or has no columns); "
            "create it before starting the sink"
        )
    rows = []
    volatile: Callable[[str], bool] | None = None  # looked up for the first DEFAULT
    for name, type_text, kind, expr in res.result_rows:
        default = None
        if kind == "DEFAULT" and expr:
            try:
                default = default_values(client, expr, 1)[0]
            except Exception as e:  # it reads other columns, which no value of a record's own can stand for
                raise SchemaError(
                    f"column `{name}` of `{database}`.`{table}` has a DEFAULT that depends on other "
                    f"columns ({expr}); chsink needs constant defaults"
                ) from e
            volatile = volatile or _volatile(client)
            if any(volatile(f) for f in _CALL.findall(expr)):
                default = AtInsert(expr)
        rows.append((name, type_text, kind, default))
    zone = str(client.query("SELECT timezone()").result_rows[0][0])  # the session's, else the server's
    return build_schema(database, table, rows, zone)


def dedup_window(client: Client, database: str, table: str) -> tuple[str, int]:
    """The table's engine and how many recent insert tokens it remembers (its deduplication window; 0 for
    engines that do not deduplicate inserts)."""
    res = client.query("SELECT engine, engine_full FROM system.tables WHERE database = {db:String} "
                       "AND name = {t:String}", parameters={"db": database, "t": table})
    if not res.result_rows:
        raise SchemaError(f"target table `{database}`.`{table}` does not exist")
    engine, full = (str(v) for v in res.result_rows[0])
    if not engine.endswith("MergeTree"):
        return engine, 0
    name = "replicated_deduplication_window" if engine.startswith("Replicated") else \
        "non_replicated_deduplication_window"
    m = re.search(rf"\b{name}\s*=\s*(\d+)", full)
    if m:
        return engine, int(m.group(1))
    default = client.query("SELECT value FROM system.merge_tree_settings WHERE name = {n:String}",
                           parameters={"n": name}).result_rows
    return engine, int(default[0][0]) if default else 0


def view_targets(client: Client, database: str, table: str) -> list[tuple[str, str]]:
    """(database, table) of the tables the materialized views reading `table` write to."""
    res = client.query("SELECT dependencies_database, dependencies_table FROM system.tables "
                       "WHERE database = {db:String} AND name = {t:String}", parameters={"db": database, "t": table})
    out: list[tuple[str, str]] = []
    for dbs, names in res.result_rows:
        for vdb, view in zip(dbs, names, strict=True):
            q = client.query("SELECT create_table_query, toString(uuid) FROM system.tables "
                             "WHERE database = {db:String} AND name = {t:String} AND engine = 'MaterializedView'",
                             parameters={"db": vdb, "t": view})
            for create, uuid in q.result_rows:
                m = re.search(r"\bTO\s+`?([\w]+)`?\.`?([\w]+)`?", str(create))
                out.append((m.group(1), m.group(2)) if m else (vdb, f".inner_id.{uuid}"))
    return out


def rows_of_topic(client: Client, database: str, table: str, topic: str) -> int:
    """How many rows of `topic` the table holds (all its rows when it has no `_topic` column to tell)."""
    has_topic = client.query("SELECT count() FROM system.columns WHERE database = {db:String} AND table = {t:String} "
                             "AND name = '_topic'", parameters={"db": database, "t": table}).result_rows[0][0]
    where = " WHERE _topic = {topic:String}" if has_topic else ""
    name = f"`{database.replace('`', '``')}`.`{table.replace('`', '``')}`"
    return int(client.query(f"SELECT count() FROM {name}{where}", parameters={"topic": topic}).result_rows[0][0])


def retry_safety(schema: TableSchema, engine: str, dedup_window: int,
                 views: Sequence[tuple[str, str, int]] = ()) -> str | None:
    """Why a retried insert into this table (or the materialized views it feeds: `views` gives each view
    target's database, table and deduplication window) could not be told from a first one; None when it can."""
    if not engine.endswith("MergeTree"):
        return (f"table {schema.fqn} has engine {engine}: chsink writes MergeTree-family tables, whose inserts it can "
                "deduplicate and count (for a Distributed table, write to its local tables as shards)")
    if dedup_window == 0:
        what = ("a retried insert (a lost reply, a crash) could not be recognised as a duplicate, and a stale writer"
                if not schema.has_offset_columns else "a stale writer")
        return (f"table {schema.fqn} has a deduplication window of 0: {what} (a paused executor, a Spark task whose "
                "retry already ran) could insert a block after the run that took over had re-sent it, and only the "
                "table's window can drop that late copy. Set non_replicated_deduplication_window (e.g. 1000) on the "
                "table")
    for db, target, window in views:
        if window == 0:
            return (f"materialized view target `{db}`.`{target}` of {schema.fqn} has a deduplication window of 0: a "
                    "retried insert would reach it twice. Set non_replicated_deduplication_window (e.g. 1000) on it")
    return None


def unsafe_target(client: Client, schema: TableSchema, exactly_once: bool = True) -> str | None:
    """retry_safety of a table as ClickHouse describes it (engine, window, the views it feeds); None for
    at-least-once sinks, which promise nothing about retries."""
    if not exactly_once:
        return None
    views = [(db, t, dedup_window(client, db, t)[1]) for db, t in view_targets(client, schema.database, schema.table)]
    return retry_safety(schema, *dedup_window(client, schema.database, schema.table), views)
