"""Runs SQL on a chdb path in a process of its own and prints the rows as JSON lines.

chdb serves one path per process, so tests and the demo reach the job's embedded ClickHouse
through this tool while the job is stopped: python -m hack.chsql PATH [--config XML] SQL...
"""

from __future__ import annotations

import argparse
import json
import sys

import clickhouse_connect


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--config")
    ap.add_argument("sql", nargs="+")
    a = ap.parse_args()
    client = clickhouse_connect.get_client(dsn=f"chdb://{a.path}",
                                           chdb_options={"config-file": a.config} if a.config else None)
    for stmt in a.sql:
        if stmt.lstrip().upper().startswith(("SELECT", "WITH", "SHOW", "DESCRIBE")):
            print(json.dumps([list(r) for r in client.query(stmt).result_rows], default=str))
        else:
            client.command(stmt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
