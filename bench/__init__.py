"""The benchmark harnesses (`python -m bench`, `bench.formats`, `bench.writer`, `bench.variants`, `bench.commits`,
`bench.latency`, `bench.versus`)."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from hack.testbed.process import REPO


def entry(main: Callable[[], int]) -> NoReturn:
    """Runs a harness's `main` as a program. SIGTERM and SIGHUP (`kill`, a timeout, a closed terminal) exit the way
    Ctrl-C does, through every `with` and `finally`: the broker and servers a harness starts run in sessions of
    their own and its job in a child, so the default exit left them running, and the next run measured beside
    them."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    raise SystemExit(main())


def stop_child(proc: subprocess.Popen[Any], grace_s: float = 30.0) -> None:
    """Stops a child the harness started (a job, a peer, a measurement): SIGTERM, which the job takes as "finish
    the batch and stop", then SIGKILL after `grace_s`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def publish(results: dict[str, Any], out: str, name: str) -> int:
    """Writes one harness's results as <out>/<date>-<name>.json and prints them."""
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{results['date']}-{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


def probe_options(ap: Any, name: str, reps: int) -> None:
    """The options of the probes that run the job side by side on one data set (bench.variants, bench.commits,
    bench.latency, bench.versus): reps, the topic's partitions, the job's batch and block sizes, and where the
    results go."""
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--batch", type=int, default=400_000, help="maxOffsetsPerTrigger")
    ap.add_argument("--block", type=int, default=200_000, help="blockOffsets")
    warm_up_option(ap)
    ap.add_argument("--name", default=name, help="the results file: results/<date>-<name>.json")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))


def warm_up_option(ap: Any) -> None:
    """`--warm-up S`: the seconds of each JVM's run left out of its rate, for its JIT compilers (see
    bench.measure.steady). 0, the default, leaves out only the first batch."""
    ap.add_argument("--warm-up", type=float, default=0.0,
                    help="seconds of each run left out of its rate for the JVM's warm-up (give it the events)")
