"""How a ClickHouse or network error is classed: an outage to retry, or a refusal of what was sent.

Decided by the error code (or, without one, the exception type), never by words, since a rejected record's
own text is quoted in its error. Below the inserter and the client, which both class errors.
"""

from __future__ import annotations

import re

from ..config import UnavailableError

_TRANSIENT_CODES = {3, 60, 81, 159, 164, 202, 203, 209, 210, 241, 242, 252, 279, 285, 319, 425, 999, 1000, 1002}
_CODE = re.compile(r"(?:Code: |error code )(\d+)")


def error_code(e: BaseException) -> int | None:
    """The ClickHouse error code of an exception (its first `Code: N`), None when it carries none."""
    code = getattr(e, "code", None)
    if isinstance(code, int):
        return code
    m = _CODE.search(str(e))
    return int(m.group(1)) if m else None


def first_line(e: BaseException) -> str:
    """An error's first line, bounded: what a log line, a shard's down reason or a status shows."""
    text = str(e)
    return text.splitlines()[0][:300] if text else type(e).__name__


def worth_retrying(e: BaseException) -> bool:
    """A system that did not answer now (by its type, or by a transient ClickHouse or network error): try later."""
    return isinstance(e, UnavailableError) or is_transient(e)


def is_transient(e: BaseException) -> bool:
    """Decided by the ClickHouse error code, or by the exception type for errors without one (the network):
    never by words, since a rejected record's own text is quoted in its error."""
    code = error_code(e)
    if code is not None:
        return code in _TRANSIENT_CODES
    from clickhouse_connect.driver.exceptions import OperationalError

    return isinstance(e, OperationalError | ConnectionError | TimeoutError | OSError)
