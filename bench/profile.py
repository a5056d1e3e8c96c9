"""Summarizes a py-spy speedscope profile: the share of samples per frame, per busy thread.

    python -m bench.profile bench/results/profile-c.speedscope.json > bench/results/profile-c.txt
"""

from __future__ import annotations

import collections
import json
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


if __name__ == "__main__":
    print(summarize(sys.argv[1]))
