"""`python -m sinkoperator`: run the operator (kopf) with a liveness endpoint, a namespace scope and, for several
replicas, leader election through a Lease (only the holder runs kopf; the others wait as standbys)."""

from __future__ import annotations

import argparse
import http.server
import os
import socket
import sys
import threading
import urllib.parse

import kopf
import kopf.cli

from . import kube, leader, metrics

# kopf's levels: no flag is INFO, --verbose and --debug are DEBUG (with full object bodies), --quiet is WARNING
LOG_FLAGS = {"debug": ["--debug"], "info": [], "warning": ["--quiet"], "error": ["--quiet"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sinkoperator")
    ap.add_argument("--namespace", "-n", action="append", default=[],
                    help="watch only these namespaces (repeatable); default: the whole cluster")
    ap.add_argument("--liveness", default="http://0.0.0.0:8080/healthz")
    ap.add_argument("--leader-election", metavar="LEASE", default=None,
                    help="the Lease that elects one active replica of several; default: off (one replica)")
    ap.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", "default"))
    ap.add_argument("--lease-timing", default="15,10,2", metavar="DURATION,RENEW_DEADLINE,RETRY",
                    help="seconds: a standby takes over a Lease unrenewed for DURATION")
    ap.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port (0: off)")
    ap.add_argument("--log-level", choices=sorted(LOG_FLAGS), default="info")
    ap.add_argument("--log-format", choices=["plain", "full", "json"], default="full")
    a = ap.parse_args(argv)
    # kopf's own logging now, as `kopf run` sets it later: the election's messages come out alike
    kopf.configure(debug=a.log_level == "debug", quiet=a.log_level in ("warning", "error"),
                   log_format=kopf.LogFormat[a.log_format.upper()])
    if a.metrics_port:
        from sparkapp.edges.prometheus import serve

        serve(a.metrics_port)
    lease = None
    if a.leader_election:
        identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
        lease = leader.Lease(a.lease_namespace, a.leader_election, identity,
                             leader.Timing(*map(float, a.lease_timing.split(","))))
        kube.load_config()
        metrics.LEADER.set(0)
        with _standby_probe(a.liveness):  # alive (not restarted) while it waits
            leader.acquire(lease)
    metrics.LEADER.set(1)
    args = ["run", "-m", "sinkoperator.handlers", f"--liveness={a.liveness}", f"--log-format={a.log_format}",
            *LOG_FLAGS[a.log_level], "--standalone"]
    args += [f"--namespace={n}" for n in a.namespace] or ["--all-namespaces"]
    try:
        return int(kopf.cli.main(args=args, standalone_mode=False) or 0)
    finally:
        if lease is not None:
            lease.release()


class _Probe(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"standby\n")

    def log_message(self, *_: object) -> None:
        pass


class _standby_probe:
    """kopf's liveness endpoint, on the same address, while kopf does not run yet."""

    def __init__(self, url: str) -> None:
        u = urllib.parse.urlsplit(url)
        self.server = http.server.ThreadingHTTPServer((u.hostname or "0.0.0.0", u.port or 80), _Probe)

    def __enter__(self) -> None:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":
    sys.exit(main())
