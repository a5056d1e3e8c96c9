"""One window of JSON lines on the fast path, its bad records sifted out one by one.

A window's block holds exactly the rows the decoder accepts, on every path, so that a retry on any path
sends the same block under the same token. On a clean window ClickHouse's parser and the decoder agree
(the fast path's invariant, tested differentially). A line the Guard flags, or that ClickHouse refuses, is
decoded alone: when the decoder dead-letters every such line, they leave the block and their neighbours
stay on the fast path; when it keeps any (a false alarm, a disagreement), the caller decodes the whole
window. Dirty data then costs one more parse of its windows, not a Python decode of every record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..core.records import DeadLetter, Message
from ..edges.insert import InsertError, first_line
from ..formats.rows import Decoder, decode_batch

log = logging.getLogger(__name__)


def send_window(offsets: tuple[int, ...], lines: Any, flagged: Sequence[int], *, decode: Decoder,
                take: Callable[[Sequence[int]], list[Message]], refused: Callable[[Any], list[int]],
                send: Callable[[tuple[int, ...], Any], None],
                dead_letter: Callable[[list[DeadLetter]], None]) -> bool:
    """Sends the window's lines but the bad ones, which go to `dead_letter` first; False when the whole
    window must take the decoder instead (nothing of it was sent, though some may have been dead-lettered).
    A transient failure of `send` is raised: the window is tried again as it is."""
    import numpy as np
    import pyarrow as pa

    for attempt in range(2):
        if flagged:
            picked = [offsets[i] for i in flagged]
            rows, dead = decode_batch(decode, take(picked))
            if rows or len(dead) != len(picked):
                return False
            dead_letter(dead)
            keep = np.setdiff1d(np.arange(len(offsets)), np.asarray(flagged, dtype=np.int64))
            offsets, lines = tuple(np.asarray(offsets)[keep].tolist()), lines.take(pa.array(keep, pa.int64()))
        if not offsets:
            return True
        try:
            send(offsets, lines)
            return True
        except InsertError as e:
            if e.transient:
                raise
            log.info("ClickHouse refused a window (%s); finding its bad lines", first_line(e.__cause__ or e))
            flagged = refused(lines) if attempt == 0 else []
            if not flagged:
                return False
    return False
