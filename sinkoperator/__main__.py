"""`python -m sinkoperator`: run the operator (kopf) with a liveness endpoint and a namespace scope."""

from __future__ import annotations

import argparse
import sys

import kopf.cli

# kopf's levels: no flag is INFO, --verbose and --debug are DEBUG (with full object bodies), --quiet is WARNING
LOG_FLAGS = {"debug": ["--debug"], "info": [], "warning": ["--quiet"], "error": ["--quiet"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sinkoperator")
    ap.add_argument("--namespace", "-n", action="append", default=[],
                    help="watch only these namespaces (repeatable); default: the whole cluster")
    ap.add_argument("--liveness", default="http://0.0.0.0:8080/healthz")
    ap.add_argument("--peering", default=None,
                    help="a KopfPeering name for several replicas; default: standalone (one replica)")
    ap.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port (0: off)")
    ap.add_argument("--log-level", choices=sorted(LOG_FLAGS), default="info")
    a = ap.parse_args(argv)
    if a.metrics_port:
        from sparkapp.edges.prometheus import serve

        serve(a.metrics_port)
    args = ["run", "-m", "sinkoperator.handlers", f"--liveness={a.liveness}", *LOG_FLAGS[a.log_level]]
    args += [f"--namespace={n}" for n in a.namespace] or ["--all-namespaces"]
    args += [f"--peering={a.peering}"] if a.peering else ["--standalone"]
    return int(kopf.cli.main(args=args, standalone_mode=False) or 0)


if __name__ == "__main__":
    sys.exit(main())
