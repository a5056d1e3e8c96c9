"""`python -m sinkoperator`: run the operator (kopf) with a liveness endpoint and a namespace scope."""

from __future__ import annotations

import argparse
import sys

import kopf.cli


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sinkoperator")
    ap.add_argument("--namespace", "-n", action="append", default=[],
                    help="watch only these namespaces (repeatable); default: the whole cluster")
    ap.add_argument("--liveness", default="http://0.0.0.0:8080/healthz")
    ap.add_argument("--peering", default=None,
                    help="a KopfPeering name for several replicas; default: standalone (one replica)")
    a = ap.parse_args(argv)
    args = ["run", "-m", "sinkoperator.handlers", f"--liveness={a.liveness}"]
    args += [f"--namespace={n}" for n in a.namespace] or ["--all-namespaces"]
    args += [f"--peering={a.peering}"] if a.peering else ["--standalone"]
    return int(kopf.cli.main(args=args, standalone_mode=False) or 0)


if __name__ == "__main__":
    sys.exit(main())
