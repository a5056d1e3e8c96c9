"""`python -m sparkapp run|verify|state|delete-checkpoint` — the job's entry point (also the SparkApplication's
main file, and that of the operator's checkpoint cleanup and scheduled verifier Jobs).

Exit codes: 0 ok, 1 verifier anomalies or a runtime failure, 2 configuration error, 3 fenced, 4 data loss,
5 state that does not match Kafka, 6 unavailable. The error's line also goes to the container's termination
message, where the operator reads it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from .config import ConfigError, SinkConfig, UnavailableError, load_config
from .core.state_machine import IrrecoverableStateError
from .delivery.context import DataLossError
from .edges.store import FencedError
from .spark.session import keep_arrow_memory


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sparkapp", description="chsink: exactly-once Kafka -> ClickHouse")
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run the streaming job")
    run.add_argument("--config", required=True)
    run.add_argument("--until-idle", type=float, help="stop gracefully after this many seconds without new data")
    run.add_argument("--max-seconds", type=float, help="stop gracefully after this many seconds")
    run.add_argument("--quiet", action="store_true")
    run.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port (0: off)")
    ver = sub.add_parser("verify", help="compare Kafka, ClickHouse and the DLQ offset by offset")
    ver.add_argument("--config", required=True)
    ver.add_argument("--json", action="store_true")
    ver.add_argument("--settled-window", type=float, metavar="SECONDS",
                     help="check only the offsets settled since the last such run (delivered, and in Kafka longer "
                     "than this); print one JSON line, also left as the termination message, and exit 0 either "
                     "way (the operator's scheduled verifier)")
    st = sub.add_parser("state", help="inspect or reset the sink's per-partition state")
    st.add_argument("action", choices=["list", "reset"])
    st.add_argument("--config", required=True)
    st.add_argument("--partition", action="append", default=[], metavar="TOPIC:N",
                    help="reset only these partitions (repeatable)")
    st.add_argument("--yes", action="store_true", help="confirm a reset")
    ck = sub.add_parser("delete-checkpoint", help="delete what chsink wrote under a checkpoint its marker gives "
                        "to this sink (the operator's cleanup Job runs it for a remote checkpoint)")
    ck.add_argument("--location", required=True)
    ck.add_argument("--sink", required=True, help="the sink's id (namespace.name), as its marker file has it")
    ck.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Hadoop setting as sparkConf spells it (spark.hadoop.fs.s3a.endpoint=...)")
    return ap


# errors a user acts on, each with its exit code (docs/configuration.md, docs/operator.md) and a one-line heading
_EXITS: dict[type[Exception], tuple[int, str]] = {
    ConfigError: (2, "configuration error"), FencedError: (3, "fenced"), DataLossError: (4, "data loss"),
    IrrecoverableStateError: (5, "state does not match Kafka"), UnavailableError: (6, "unavailable"),
}


def main(argv: Sequence[str] | None = None) -> int:
    keep_arrow_memory()  # before anything loads pyarrow
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("py4j", "kazoo", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        if args.cmd == "delete-checkpoint":
            return _delete_checkpoint(args)
        cfg = load_config(args.config)
        if args.cmd == "run":
            from .spark.job import SinkJob

            if args.metrics_port:
                from .edges.prometheus import serve

                serve(args.metrics_port)
            return SinkJob(cfg, quiet=args.quiet).run(until_idle=args.until_idle, max_seconds=args.max_seconds)
        if args.cmd == "verify" and args.settled_window is not None:
            return _verify_settled(cfg, args.settled_window)
        if args.cmd == "verify":
            from .verify import verify

            report = verify(cfg)
            print(report.to_json() if args.json else report.to_text())
            return 0 if report.ok else 1
        return _state(cfg, args)
    except tuple(_EXITS) as e:
        code, what = next(v for k, v in _EXITS.items() if isinstance(e, k))
        print(f"chsink: {what}: {e}", file=sys.stderr)
        _terminate_with(f"chsink: {what}: {e}")
        return code
    except Exception as e:
        _terminate_with(f"chsink: unexpected {type(e).__name__}: {(str(e).splitlines() or [''])[0]}")
        raise


# Kubernetes keeps the first 4096 bytes of this file in the pod's status (state.terminated.message) once the
# container exits: the spark-operator reports only the exit code, and deletes the pod (its log) on each retry.
TERMINATION_LOG = "/dev/termination-log"
_TERMINATION_LIMIT = 4096


def _terminate_with(line: str) -> None:
    path = os.environ.get("CHSINK_TERMINATION_LOG", TERMINATION_LOG)
    if not os.path.exists(path):  # the kubelet creates it in a container; elsewhere there is no reader
        return
    try:
        with open(path, "wb") as f:
            f.write(line.encode()[:_TERMINATION_LIMIT])
    except OSError:  # never hide the error being reported
        pass


def _delete_checkpoint(args: argparse.Namespace) -> int:
    """Prints what was deleted or kept and leaves it in the termination message, where the operator reads it
    for the sink's Event."""
    from .spark.checkpoint import delete_with_hadoop

    conf = dict(kv.split("=", 1) for kv in args.conf)
    outcome = delete_with_hadoop(args.location, args.sink, conf)
    print(outcome)
    _terminate_with(outcome)
    return 0


def _verify_settled(cfg: SinkConfig, window_s: float) -> int:
    """An anomaly is this run's result, not its failure: the Job succeeds and the operator reports it."""
    import time

    from .verify_settled import verify_settled

    summary = verify_settled(cfg, window_s, time.time()).summary()
    print(summary)
    _terminate_with(summary)
    return 0


def _state(cfg: SinkConfig, args: argparse.Namespace) -> int:
    from .edges.clickhouse import clickhouse_client
    from .edges.store import state_store

    store = state_store(cfg, clickhouse_client(cfg.clickhouse))
    store.ensure_schema()
    if args.action == "list":
        state = store.sink_state(cfg.name)
        rows = state.rows
        print(f"{'TOPIC':<24} {'PART':>4} {'TABLE':<16} {'STATE':<6} {'MIN':>12} {'MAX':>12} {'EPOCH':>5} "
              f"{'LAYOUT':>6} {'SHARD':>5} UPDATED")
        for r in rows:
            s = r.state
            print(f"{r.pk.topic:<24} {r.pk.partition:>4} {r.pk.table or '-':<16} {s.phase.value:<6} "
                  f"{s.range.min:>12} {s.range.max:>12} {s.epoch:>5} {s.layout:>6} {r.shard:>5} "
                  f"{r.updated_at:%Y-%m-%d %H:%M:%S}")
        for (t, p), at in sorted(state.read_through.items()):
            print(f"{t}/{p} read through offset {at - 1}: its tables resume at {at} at the earliest, or where BEFORE")
        print(f"{len(rows)} partition state row(s) for sink {cfg.name} (current epoch {store.current_epoch(cfg.name)})")
        return 0
    partitions = None
    if args.partition:
        try:
            partitions = [(t, int(p)) for t, p in (x.rsplit(":", 1) for x in args.partition)]
        except ValueError:
            raise ConfigError(f"--partition takes TOPIC:N, got {args.partition}") from None
    what = ", ".join(f"{t}/{p}" for t, p in partitions) if partitions else "ALL partitions"
    if not args.yes:
        print(f"refusing to reset {what} of sink {cfg.name} without --yes. Stop the job first: after a reset it "
              "starts from its checkpoint or the earliest offset, which may insert rows again.", file=sys.stderr)
        return 2
    n = store.delete(cfg.name, partitions)
    print(f"deleted {n} state row(s) of sink {cfg.name} ({what})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
