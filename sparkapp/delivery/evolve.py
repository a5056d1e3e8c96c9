"""Schema evolution, the IO side: the columns a batch's records need, added to the target table on every
shard before the partition's state transition, by a writer that still holds the sink's epoch.

`ALTER TABLE ... ADD COLUMN IF NOT EXISTS` does nothing the second time, so a crash between it and the
insert leaves a column that the retry finds: the retry's blocks are built under the table as it is then,
which is the table the first attempt would have written, and a retry whose first attempt landed is
dropped by its token as always. A fenced writer raises before it alters anything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..core.records import Message
from ..edges.store import PartitionKey
from ..formats.evolution import new_columns
from ..formats.registry import Reader
from ..formats.rows import DecodeError, NoRow
from .context import WriterContext

log = logging.getLogger(__name__)


def _ident(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def add_columns(ctx: WriterContext, pk: PartitionKey, msgs: Sequence[Message], read: Reader,
                targets: Callable[[], Sequence[tuple[Any, str]]], known: set[str]) -> dict[str, str]:
    """Adds the columns the messages' records need (formats/evolution.py) to the table in each (client,
    database) `targets()` gives (asked only when there is a column to add); returns them, name -> type (empty:
    none). `known` names fields not to add (tried already, or columns the schema leaves out), and grows by what
    is added."""
    records = []
    for m in msgs:
        try:
            records.append(read(m))
        except (DecodeError, NoRow):
            continue  # the decoder dead-letters it with the reason, or it holds no row
    new = new_columns(ctx.inserter.schema, records, known)
    if not new:
        return {}
    ctx.store.check_fence(pk, ctx.epoch)  # a stale writer changes nothing
    table = ctx.inserter.schema.table
    for client, database in targets():
        for name, type_text in new.items():
            client.command(f"ALTER TABLE {_ident(database)}.{_ident(table)} ADD COLUMN IF NOT EXISTS "
                           f"{_ident(name)} {type_text}")
    known.update(new)
    log.info("%s: added column(s) %s to `%s` for the fields its records bring", pk,
             ", ".join(f"{n} {t}" for n, t in new.items()), table)
    ctx.fault("after_alter")
    return new
