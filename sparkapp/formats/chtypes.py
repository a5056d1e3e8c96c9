"""ClickHouse type strings parsed into a tree, and strict value converters for each type (pure).

A converter takes a decoded JSON/Avro value and returns what clickhouse-connect's Native writer
takes for that type (temporal values become integer days/seconds/ticks, so no client time zone is
involved), or raises ConversionError with a reason precise enough for a dead-letter header.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import ipaddress
import json
import math
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

Converter = Callable[[Any], Any]


class ConversionError(ValueError):
    """A value does not fit its column's type."""


class JsonNumber(float):
    """A JSON number with a fraction or an exponent: a float wherever one is wanted, and the digits as written
    for Decimal columns, which a float would round (-48209386309284.3501 is not a float)."""

    text: str

    def __new__(cls, text: str) -> JsonNumber:
        number = super().__new__(cls, text)
        number.text = text
        return number


@dataclass(frozen=True)
class CHType:
    """A parsed ClickHouse type: name plus arguments (types, numbers, strings, named fields, enum items)."""

    name: str
    args: tuple[Any, ...] = ()
    field_names: tuple[str, ...] | None = None  # for named Tuple/Nested
    # DateTime/DateTime64 naming no zone: the zone ClickHouse reads their naive text in (not part of the type's
    # name: set by `localize` from the session's `timezone()`)
    zone: str = "UTC"

    def __str__(self) -> str:
        if not self.args:
            return self.name
        parts = []
        for i, a in enumerate(self.args):
            s = f"'{a}'" if isinstance(a, str) else f"'{a[0]}' = {a[1]}" if isinstance(a, tuple) else str(a)
            parts.append(f"{self.field_names[i]} {s}" if self.field_names else s)
        return f"{self.name}({', '.join(parts)})"


def localize(t: CHType, zone: str) -> CHType:
    """The type with every DateTime/DateTime64 in it that names no zone reading naive text in `zone`, as ClickHouse
    reads it (the session's zone, else the server's): both paths then store the same instant."""
    args = tuple(localize(a, zone) if isinstance(a, CHType) else a for a in t.args)
    return CHType(t.name, args, t.field_names, zone if t.name in ("DateTime", "DateTime64") else t.zone)


_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^'\\]|\\.)*')|(?P<num>-?\d+)|(?P<id>[A-Za-z_][A-Za-z0-9_.]*|`[^`]+`)|(?P<p>[(),=]))"
)


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m:
            raise ValueError(f"cannot parse ClickHouse type {text!r} at {pos}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def parse_type(text: str) -> CHType:
    """Parses a type string as found in system.columns."""
    toks = _tokens(text)
    node, i = _parse(toks, 0)
    if i != len(toks):
        raise ValueError(f"trailing input in ClickHouse type {text!r}")
    return node


def _unquote(s: str) -> str:
    return s[1:-1].encode().decode("unicode_escape") if s.startswith("'") else s.strip("`")


def _parse(toks: list[tuple[str, str]], i: int) -> tuple[CHType, int]:
    kind, name = toks[i]
    if kind != "id":
        raise ValueError(f"expected a type name, got {name!r}")
    i += 1
    if i >= len(toks) or toks[i][1] != "(":
        return CHType(name), i
    i += 1
    args: list[Any] = []
    names: list[str] = []
    while toks[i][1] != ")":
        kind, val = toks[i]
        if kind == "str" and i + 1 < len(toks) and toks[i + 1][1] == "=":  # Enum item
            args.append((_unquote(val), int(toks[i + 2][1])))
            i += 3
        elif kind == "str":
            args.append(_unquote(val))
            i += 1
        elif kind == "num":
            args.append(int(val))
            i += 1
        elif kind == "id" and i + 1 < len(toks) and toks[i + 1][0] == "id":  # named field: `name Type`
            names.append(_unquote(val))
            sub, i = _parse(toks, i + 1)
            args.append(sub)
        else:
            sub, i = _parse(toks, i)
            args.append(sub)
        if toks[i][1] == ",":
            i += 1
    return CHType(name, tuple(args), tuple(names) if names else None), i + 1


# ---- converters -------------------------------------------------------------------------------

_INT_BITS = {f"{p}Int{b}": (p == "U", b) for p in ("", "U") for b in (8, 16, 32, 64, 128, 256)}
_DATE_MIN, _DATE_MAX = dt.date(1970, 1, 1), dt.date(2149, 6, 6)
_DATE32_MIN, _DATE32_MAX = dt.date(1900, 1, 1), dt.date(2299, 12, 31)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int | float | decimal.Decimal):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list | tuple):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def _wrong(t: CHType | str, v: Any) -> ConversionError:
    return ConversionError(f"expected {t}, got {_kind(v)} {_short(v)}")


def _short(v: Any) -> str:
    s = json.dumps(v, default=str) if not isinstance(v, bytes) else repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _int_range(name: str) -> tuple[int, int]:
    unsigned, bits = _INT_BITS[name]
    return (0, 2**bits - 1) if unsigned else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def _int_conv(name: str) -> Converter:
    lo, hi = _int_range(name)

    def conv(v: Any) -> int:
        if isinstance(v, bool):
            raise _wrong(name, v)
        if isinstance(v, float):
            if not v.is_integer():
                raise ConversionError(f"expected {name}, got non-integral number {v}")
            v = int(v)
        elif isinstance(v, str):
            try:
                v = int(v.strip())
            except ValueError:
                raise _wrong(name, v) from None
        elif not isinstance(v, int):
            raise _wrong(name, v)
        if not lo <= v <= hi:
            raise ConversionError(f"value {v} out of range for {name} [{lo}, {hi}]")
        return int(v)

    return conv


def _float_conv(name: str) -> Converter:
    def conv(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float | str):
            raise _wrong(name, v)
        try:
            f = float(v)
        except ValueError:
            raise _wrong(name, v) from None
        if name == "Float32" and math.isfinite(f) and abs(f) > 3.4028234663852886e38:
            raise ConversionError(f"value {v} out of range for Float32")
        return f

    return conv


def _decimal_conv(t: CHType) -> Converter:
    if t.name == "Decimal":
        p, s = (*t.args, 0)[:2] if len(t.args) == 1 else t.args
    else:  # Decimal32(S) etc.
        p, s = {"Decimal32": 9, "Decimal64": 18, "Decimal128": 38, "Decimal256": 76}[t.name], t.args[0]
    quantum = decimal.Decimal(1).scaleb(-s)
    limit = decimal.Decimal(10) ** (p - s)
    ctx = decimal.Context(prec=100)

    def conv(v: Any) -> decimal.Decimal:
        if isinstance(v, bool) or not isinstance(v, int | float | str | decimal.Decimal):
            raise _wrong(t, v)
        try:
            d = ctx.create_decimal(v.text if isinstance(v, JsonNumber) else
                                   v if isinstance(v, decimal.Decimal) else str(v).strip())
        except decimal.InvalidOperation:
            raise _wrong(t, v) from None
        if not d.is_finite():
            raise ConversionError(f"value {v} is not finite, not representable in {t}")
        q = d.quantize(quantum, rounding=decimal.ROUND_DOWN, context=ctx)
        if abs(q) >= limit:
            raise ConversionError(f"value {v} out of range for {t} (max {p - s} integer digits)")
        return q

    return conv


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.lower() in ("true", "false", "0", "1"):
        return v.lower() in ("true", "1")
    raise _wrong("Bool", v)


def _string(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bytes):  # bytes that are not UTF-8 ride as escapes, the inserter writes them back as they were
        return v.decode("utf-8", errors="surrogateescape")
    raise _wrong("String", v)


def _fixed_conv(t: CHType) -> Converter:
    n = t.args[0]

    def conv(v: Any) -> bytes:
        b = v.encode() if isinstance(v, str) else v if isinstance(v, bytes) else None
        if b is None:
            raise _wrong(t, v)
        if len(b) > n:
            raise ConversionError(f"value of {len(b)} bytes too long for {t}")
        return b.ljust(n, b"\0")

    return conv


def _uuid(v: Any) -> uuid.UUID:
    if isinstance(v, uuid.UUID):
        return v
    if isinstance(v, bytes) and len(v) == 16:
        return uuid.UUID(bytes=v)
    if not isinstance(v, str):
        raise _wrong("UUID", v)
    try:
        return uuid.UUID(v)
    except ValueError:
        raise ConversionError(f"invalid UUID {_short(v)}") from None


def _date_conv(name: str) -> Converter:
    lo, hi = (_DATE_MIN, _DATE_MAX) if name == "Date" else (_DATE32_MIN, _DATE32_MAX)

    def conv(v: Any) -> int:
        if isinstance(v, bool):
            raise _wrong(name, v)
        if isinstance(v, int):  # days since epoch, as Avro's `date` logical type
            d = dt.date(1970, 1, 1) + dt.timedelta(days=v)
        elif isinstance(v, dt.datetime):
            d = v.date()
        elif isinstance(v, dt.date):
            d = v
        elif isinstance(v, str):
            try:
                d = dt.date.fromisoformat(v.strip()[:10])
            except ValueError:
                raise ConversionError(f"invalid {name} {_short(v)}: expected YYYY-MM-DD") from None
        else:
            raise _wrong(name, v)
        if not lo <= d <= hi:
            raise ConversionError(f"date {d} out of range for {name} [{lo}, {hi}]")
        return (d - dt.date(1970, 1, 1)).days

    return conv


def _parse_datetime(v: Any, tz: dt.tzinfo, what: str) -> dt.datetime:
    """Accepts ISO-8601 / 'YYYY-MM-DD hh:mm:ss[.fff]' strings (naive means the column's zone) or epoch seconds."""
    if isinstance(v, bool):
        raise _wrong(what, v)
    if isinstance(v, int | float):
        return _EPOCH + dt.timedelta(seconds=v)
    if isinstance(v, dt.datetime):
        return v if v.tzinfo else v.replace(tzinfo=tz)
    if not isinstance(v, str):
        raise _wrong(what, v)
    s = v.strip()
    if s.endswith("Z"):
        s = s[:-1] + "+00:00"
    try:
        d = dt.datetime.fromisoformat(s)
    except ValueError:
        raise ConversionError(f"invalid {what} {_short(v)}: expected ISO-8601 or epoch seconds") from None
    return d if d.tzinfo else d.replace(tzinfo=tz)


def _datetime_conv(t: CHType) -> Converter:
    tz = ZoneInfo(t.args[0] if t.args else t.zone)

    def conv(v: Any) -> int:
        secs = math.floor((_parse_datetime(v, tz, str(t)) - _EPOCH).total_seconds())
        if not 0 <= secs <= 4294967295:
            raise ConversionError(f"value {_short(v)} out of range for {t}")
        return secs

    return conv


def _datetime64_conv(t: CHType) -> Converter:
    scale = t.args[0] if t.args else 3
    tz = ZoneInfo(t.args[1] if len(t.args) > 1 else t.zone)
    per_sec = 10**scale

    def conv(v: Any) -> int:
        if isinstance(v, int) and not isinstance(v, bool):  # epoch seconds, as for DateTime
            return int(v * per_sec)
        d = _parse_datetime(v, tz, str(t)) - _EPOCH
        # exact integer arithmetic: days, seconds, microseconds
        micros = (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds
        ticks = micros * per_sec // 1_000_000
        if isinstance(v, str) and scale > 6:  # keep sub-microsecond digits the string carries
            frac = re.search(r"\.(\d+)", v)
            if frac and len(frac.group(1)) > 6:
                ticks = (micros // 1_000_000) * per_sec + int(frac.group(1)[:scale].ljust(scale, "0"))
        return int(ticks)

    return conv


def _ip_conv(name: str) -> Converter:
    def conv(v: Any) -> Any:
        if not isinstance(v, str | int) or isinstance(v, bool):
            raise _wrong(name, v)
        try:
            addr = ipaddress.ip_address(v)
        except ValueError:
            raise ConversionError(f"invalid {name} address {_short(v)}") from None
        if name == "IPv4":
            if addr.version != 4:
                raise ConversionError(f"invalid IPv4 address {_short(v)}")
            return addr
        return ipaddress.IPv6Address(f"::ffff:{addr}") if addr.version == 4 else addr

    return conv


def _enum_conv(t: CHType) -> Converter:
    by_name = {name: name for name, _ in t.args}
    by_value = {value: name for name, value in t.args}

    def conv(v: Any) -> str:
        if isinstance(v, str) and v in by_name:
            return v
        if isinstance(v, int) and not isinstance(v, bool) and v in by_value:
            return str(by_value[v])
        raise ConversionError(f"unknown {t.name} value {_short(v)}; allowed: {', '.join(map(repr, by_name))}")

    return conv


def _array_conv(t: CHType) -> Converter:
    inner = converter(t.args[0])

    def conv(v: Any) -> list[Any]:
        if not isinstance(v, list | tuple):
            raise _wrong(t, v)
        out = []
        for i, x in enumerate(v):
            try:
                out.append(inner(x))
            except ConversionError as e:
                raise ConversionError(f"element [{i}]: {e}") from None
        return out

    return conv


def _map_conv(t: CHType) -> Converter:
    kconv, vconv = converter(t.args[0]), converter(t.args[1])

    def conv(v: Any) -> dict[Any, Any]:
        if isinstance(v, list):  # Avro-style list of {key, value} pairs
            v = {e["key"]: e["value"] for e in v} if all(isinstance(e, dict) and "key" in e for e in v) else v
        if not isinstance(v, dict):
            raise _wrong(t, v)
        out = {}
        for k, x in v.items():
            try:
                out[kconv(k)] = vconv(x)
            except ConversionError as e:
                raise ConversionError(f"key {_short(k)}: {e}") from None
        return out

    return conv


def _tuple_conv(t: CHType) -> Converter:
    convs = [converter(a) for a in t.args]
    names = t.field_names

    def conv(v: Any) -> tuple[Any, ...]:
        if isinstance(v, dict) and names:
            missing = [n for n in names if n not in v]
            if missing:
                raise ConversionError(f"{t}: missing field(s) {', '.join(missing)}")
            v = [v[n] for n in names]
        if not isinstance(v, list | tuple) or len(v) != len(convs):
            raise _wrong(t, v)
        out = []
        for i, (c, x) in enumerate(zip(convs, v, strict=True)):
            try:
                out.append(c(x))
            except ConversionError as e:
                raise ConversionError(f"field {names[i] if names else i + 1}: {e}") from None
        return tuple(out)

    return conv


def _json(v: Any) -> Any:
    if isinstance(v, dict):
        return v
    if isinstance(v, str):
        try:
            parsed = json.loads(v)
        except ValueError:
            raise ConversionError(f"invalid JSON text {_short(v)}") from None
        if isinstance(parsed, dict):
            return parsed
    raise _wrong("JSON object", v)


def _nullable_conv(t: CHType) -> Converter:
    inner = converter(t.args[0])

    def conv(v: Any) -> Any:
        return None if v is None else inner(v)

    return conv


# Which members of a Variant a value may go to, by what the value is, in order of preference: a value goes to
# the first of them that takes it whole (its strict converter), never by guessing from its text (a string goes
# to String when there is one, however much it looks like a date). Only the decoder writes Variant columns.
_NUMBER_MEMBERS = ("Float64", "Float32", "BFloat16", "Decimal", "Decimal32", "Decimal64", "Decimal128", "Decimal256")
_VARIANT_MEMBERS: tuple[tuple[type | tuple[type, ...], tuple[str, ...]], ...] = (
    (bool, ("Bool",)),
    (int, ("Int64", "UInt64", "Int128", "UInt128", "Int256", "UInt256", "Int32", "UInt32", "Int16", "UInt16",
           "Int8", "UInt8", *_NUMBER_MEMBERS)),
    (float, _NUMBER_MEMBERS),
    (decimal.Decimal, (*_NUMBER_MEMBERS[3:], *_NUMBER_MEMBERS[:3])),
    (str, ("String", "FixedString", "UUID", "IPv4", "IPv6", "Enum8", "Enum16", "Date", "Date32", "DateTime",
           "DateTime64")),
    (bytes, ("String", "FixedString")),
    ((list, tuple), ("Array", "Tuple")),
    (dict, ("Map", "Tuple", "JSON")),
    (dt.datetime, ("DateTime64", "DateTime")),
    (dt.date, ("Date", "Date32")),
    (uuid.UUID, ("UUID",)),
)


def _variant_conv(t: CHType) -> Converter:
    from clickhouse_connect.datatypes.dynamic import typed_variant

    members = [(m, str(m), _base_converter(m)) for m in t.args if isinstance(m, CHType)]

    def candidates(v: Any) -> list[tuple[str, Converter]]:
        for kinds, names in _VARIANT_MEMBERS:
            if isinstance(v, kinds):
                return [(text, conv) for name in names for m, text, conv in members if m.name == name]
        return []

    def conv(v: Any) -> Any:
        if v is None:
            return None
        for text, member in candidates(v):
            try:
                return typed_variant(member(v), text)
            except ConversionError:
                continue
        raise ConversionError(f"no member of {t} takes {_short(v)}")

    return conv


_DYNAMIC_INTS = ("Int64", "UInt64", "Int128", "UInt128", "Int256", "UInt256")


def _int_type(values: list[int]) -> str:
    """The first of Int64, UInt64, Int128, ... that holds every one of the values."""
    for name in _DYNAMIC_INTS:
        lo, hi = _int_range(name)
        if all(lo <= v <= hi for v in values):
            return name
    raise ConversionError(f"integer {_short(max(values, key=abs))} out of range for every integer type")


def dynamic_type(v: Any) -> str:
    """The type a value takes in a Dynamic column, from what the value is (its JSON, Avro or Protobuf kind),
    never from its text: integers the first of Int64, UInt64, Int128, ... that holds them, other numbers Float64
    (Avro decimals Decimal), text and bytes String, objects JSON, lists Array of their elements' one type
    (Nullable when some are null; integers with fractions Float64)."""
    if isinstance(v, bool):
        return "Bool"
    if isinstance(v, int):
        return _int_type([v])
    if isinstance(v, float):
        return "Float64"
    if isinstance(v, decimal.Decimal):
        exponent = v.as_tuple().exponent
        return f"Decimal(76, {max(0, -exponent) if isinstance(exponent, int) else 0})"
    if isinstance(v, str | bytes):
        return "String"
    if isinstance(v, dt.datetime):
        return "DateTime64(6, 'UTC')"
    if isinstance(v, dt.date):
        return "Date32"
    if isinstance(v, uuid.UUID):
        return "UUID"
    if isinstance(v, dict):
        return "JSON"
    if isinstance(v, list | tuple):
        items = [x for x in v if x is not None]
        kinds = {dynamic_type(x) for x in items}
        if all(isinstance(x, int) and not isinstance(x, bool) for x in items) and items:
            kinds = {_int_type(list(items))}
        elif kinds and kinds <= {*_DYNAMIC_INTS, "Float64"}:
            kinds = {"Float64"}
        if len(kinds) > 1:
            raise ConversionError(f"a list mixing {', '.join(sorted(kinds))} has no one type in a Dynamic column; "
                                  "give the column a type")
        inner = kinds.pop() if kinds else "String"
        nullable = len(items) < len(v) and not inner.startswith(("Array", "JSON", "Map", "Tuple"))
        if len(items) < len(v) and not nullable:
            raise ConversionError(f"a list of {inner} with nulls has no type in a Dynamic column")
        return f"Array(Nullable({inner}))" if nullable else f"Array({inner})"
    raise _wrong("Dynamic", v)


@functools.cache
def _dynamic_member(text: str) -> Converter:
    """A Dynamic value's converter for the type it takes, built once per type (not per value)."""
    from clickhouse_connect.datatypes.dynamic import typed_variant

    conv = converter(parse_type(text))
    return lambda v: typed_variant(conv(v), text)


def _dynamic(v: Any) -> Any:
    return None if v is None else _dynamic_member(dynamic_type(v))(v)


def converter(t: CHType) -> Converter:
    """The strict converter of a type; None is rejected unless the type is Nullable (or a Variant or Dynamic:
    NULL is one of their values)."""
    name = t.name
    if name == "Variant":
        return _variant_conv(t)
    if name == "Dynamic":
        return _dynamic
    if name == "Nullable":
        return _nullable_conv(t)
    if name == "LowCardinality":
        return converter(t.args[0])
    base = _base_converter(t)

    def non_null(v: Any) -> Any:
        if v is None:
            raise ConversionError(f"null for non-Nullable {t}")
        return base(v)

    return non_null


_FACTORIES: dict[str, Callable[[CHType], Converter]] = {
    "Bool": lambda t: _bool, "String": lambda t: _string, "UUID": lambda t: _uuid, "JSON": lambda t: _json,
    **{n: (lambda t: _int_conv(t.name)) for n in _INT_BITS},
    **{n: (lambda t: _float_conv(t.name)) for n in ("Float32", "Float64", "BFloat16")},
    **{n: _decimal_conv for n in ("Decimal", "Decimal32", "Decimal64", "Decimal128", "Decimal256")},
    "Date": lambda t: _date_conv(t.name), "Date32": lambda t: _date_conv(t.name),
    "DateTime": _datetime_conv, "DateTime64": _datetime64_conv,
    "IPv4": lambda t: _ip_conv(t.name), "IPv6": lambda t: _ip_conv(t.name),
    "Enum8": _enum_conv, "Enum16": _enum_conv, "FixedString": _fixed_conv,
    "Array": _array_conv, "Map": _map_conv, "Tuple": _tuple_conv,
}


def _base_converter(t: CHType) -> Converter:
    factory = _FACTORIES.get(t.name)
    if factory is None:
        raise ValueError(f"unsupported ClickHouse type {t}")
    return factory(t)


def zero_value(t: CHType) -> Any:
    """The type's implicit default (what ClickHouse uses for a column with no DEFAULT expression)."""
    n = t.name
    if n in ("Nullable", "Variant", "Dynamic"):
        return None
    if n == "LowCardinality":
        return zero_value(t.args[0])
    if n in _INT_BITS or n in ("Date", "Date32", "DateTime", "DateTime64"):
        return 0
    if n.startswith("Float") or n == "BFloat16":
        return 0.0
    if n.startswith("Decimal"):
        return decimal.Decimal(0)
    if n == "Bool":
        return False
    if n == "String":
        return ""
    if n == "FixedString":
        return b"\0" * t.args[0]
    if n == "UUID":
        return uuid.UUID(int=0)
    if n == "IPv4":
        return ipaddress.IPv4Address(0)
    if n == "IPv6":
        return ipaddress.IPv6Address(0)
    if n in ("Enum8", "Enum16"):
        return t.args[0][0]
    if n == "Array":
        return []
    if n in ("Map", "JSON"):
        return {}
    if n == "Tuple":
        return tuple(zero_value(a) for a in t.args)
    raise ValueError(f"no default for {t}")
