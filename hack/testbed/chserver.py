"""A ClickHouse server process from the chdb wheel: clickhouse-local (ClickHouse 26.9) with its own HTTP and
native TCP listeners, for the test bed and the demo.

chdb's usual entry points run an embedded server that cannot listen; `chdb._chdb.query(..., path=...)` runs
the LocalServer program, which reads ./config.xml (ports, ZooKeeper) and can start the listeners. They stop
when the call's queries end, so the last query blocks reading a FIFO until the process is told to stop.
Loopback only: the `default` user has no password.

    python -m hack.testbed.chserver DIR   (DIR holds config.xml; data goes to DIR/data)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(workdir: str) -> None:
    os.chdir(workdir)  # LocalServer reads ./config.xml
    fifo = Path(workdir) / "stop.fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    from chdb import _chdb

    _chdb.query(  # type: ignore[attr-defined]
        f"SYSTEM START LISTEN HTTP; SYSTEM START LISTEN TCP; SELECT * FROM file('{fifo}', 'LineAsString')",
        "TabSeparated", path=str(Path(workdir) / "data"))


if __name__ == "__main__":
    main(sys.argv[1])
