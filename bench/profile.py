"""Summarizes the profiles `python -m bench --profile` records of (c): py-spy's of the driver's Python (the share
of samples per frame, per busy thread) and Java Flight Recorder's of the driver JVM (the share of samples per
component, over the steady batches only).

    python -m bench.profile bench/results/profile-c.speedscope.json > bench/results/profile-c.txt
    python -m bench.profile bench/results/profile-c.jfr [FROM TO] > bench/results/profile-c-jvm.txt
"""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys


def summarize(path: str, top: int = 30) -> str:
    with open(path) as f:
        data = json.load(f)
    frames = data["shared"]["frames"]
    out = []
    for prof in data["profiles"]:
        samples = prof.get("samples", [])
        if len(samples) < 50 or not any(len(s) > 3 for s in samples):
            continue
        inclusive: collections.Counter[str] = collections.Counter()
        for stack in samples:
            seen = set()
            for i in stack:
                f = frames[i]
                key = f"{f['name']} ({f.get('file', '').rsplit('/', 1)[-1]}:{f.get('line', '')})"
                if key not in seen:
                    seen.add(key)
                    inclusive[key] += 1
        out.append(f"== {prof['name']}: {len(samples)} samples")
        out += [f"{100 * n / len(samples):5.1f}%  {k}" for k, n in inclusive.most_common(top)
                if "threading.py" not in k and "thread.py" not in k and "runpy" not in k]
    return "\n".join(out)


# Where a JVM sample's CPU goes: the first frame from the leaf that belongs to one of these (a JDK or Scala
# library frame such as Arrays.copyOf counts for the code that called it); the first pattern that matches names it.
JVM_PARTS = [
    ("logging (lines built, mostly to be dropped)", r"(^org\.apache\.logging\.|slf4j|\.internal\.Logging|LogContext)"),
    ("Kafka client (fetch, record parsing)", r"^org\.apache\.kafka\."),
    ("Spark's Kafka source (records to rows)", r"(^org\.apache\.spark\.sql\.kafka010\.|UninterruptibleThread)"),
    ("Arrow conversion and IPC (toArrow)", r"^org\.apache\.(arrow\.|spark\.sql\.execution\.arrow\.)"),
    ("row projection (generated code)", r"(GeneratedClass|\.UnsafeRow|\.codegen\.|\.unsafe\.|InternalRow)"),
    ("task results and their serialization", r"(\.scheduler\.|\.serializer\.|\.storage\.|TaskResult|\.io\.Chunked)"),
    ("Python hand-over (sockets, py4j)", r"(\.api\.python\.|py4j\.|\.security\.SocketAuth)"),
    ("streaming engine (offsets, commits, progress)", r"^org\.apache\.spark\.sql\.execution\.streaming\."),
    ("other Spark", r"^org\.apache\.spark\."),
]
_PARTS = [(name, re.compile(pat)) for name, pat in JVM_PARTS]
_FRAME = re.compile(r"^\s+([\w.$<>]+)\.[\w$<>]+\(", re.M)
_START = re.compile(r"startTime = (\d+):(\d+):([\d.]+)")  # UTC time of day (the JVMs run in UTC)


def summarize_jfr(path: str, start: float | None = None, end: float | None = None) -> str:
    """The driver JVM's CPU samples (`jdk.ExecutionSample`) between start and end (epoch seconds) by component."""
    text = subprocess.run(["jfr", "print", "--stack-depth", "64", "--events", "jdk.ExecutionSample", path],
                          capture_output=True, text=True, check=True).stdout
    parts: collections.Counter[str] = collections.Counter()
    n = 0
    for event in text.split("jdk.ExecutionSample {")[1:]:
        when = _START.search(event)
        if when and start is not None and end is not None:
            h, m, sec = when.groups()
            t = start - start % 86400 + int(h) * 3600 + int(m) * 60 + float(sec)
            t += 86400 if t < start - 43200 else 0  # past midnight
            if not start <= t <= end:
                continue
        frames = _FRAME.findall(event)
        if not frames:
            continue
        n += 1
        parts[next((name for f in frames for name, pat in _PARTS if pat.search(f)), "JDK and Scala only")] += 1
    window = f" from {start:.1f} to {end:.1f}" if start is not None and end is not None else ""
    out = [f"== driver JVM: {n} samples{window}"]
    out += [f"{100 * c / max(n, 1):5.1f}%  {name}" for name, c in parts.most_common()]
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1].endswith(".jfr"):
        bounds = [float(x) for x in sys.argv[2:4]]
        print(summarize_jfr(sys.argv[1], *bounds))
    else:
        print(summarize(sys.argv[1]))
