"""Debezium change events (pure): each one becomes the row of the changed record, marked with its operation.

A create, update or snapshot read (`c`, `u`, `r`) gives the row after the change; a delete (`d`) gives the
row before it (at least its key columns) with `_deleted` = 1, so a ReplacingMergeTree(version, _deleted)
table ends up holding each key's last state and a changelog table every change. The envelope may come
wrapped by Kafka Connect's JSON converter (`{"schema": ..., "payload": ...}`). The tombstone Debezium
writes after a delete (a null value, for log compaction) carries nothing to store: it is skipped, and
counted. A truncate (`t`) or anything else is dead-lettered with the reason: it is not one row's change.
"""

from __future__ import annotations

from typing import Any

from .rows import DecodeError, NoRow

OPS = {"c": "create", "u": "update", "r": "read", "d": "delete"}
# the columns a change event fills besides the record's own fields
CHANGE_COLUMNS = ("_op", "_deleted")


class Skip(NoRow):
    """A tombstone of a change stream."""


def change_row(event: dict[str, Any]) -> dict[str, Any]:
    """The row a change event stands for, with `_op` and `_deleted`; DecodeError naming what is wrong."""
    if "payload" in event and "schema" in event:
        event = event["payload"]
        if not isinstance(event, dict):
            raise DecodeError("Debezium envelope: `payload` is not an object")
    op = event.get("op")
    if op not in OPS:
        if op == "t":
            raise DecodeError("Debezium truncate event: a whole table's change, not a row's (not applied)")
        raise DecodeError(f"Debezium envelope: `op` is {op!r}, expected one of {', '.join(OPS)}")
    side = "before" if op == "d" else "after"
    data = event.get(side)
    if not isinstance(data, dict):
        raise DecodeError(f"Debezium {OPS[op]} event without a `{side}` object")
    return {**data, "_op": op, "_deleted": int(op == "d")}
