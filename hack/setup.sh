#!/usr/bin/env bash
# Creates the Python environment (uv, locked) and provisions the test bed. Safe to re-run.
# Usage: hack/setup.sh [PART...]: the parts of hack/provision.sh (default: all; `demo`: only what the demo needs).
#        hack/setup.sh test: what the first tests need now, and the rest (the Go builds of the Kubernetes parts
#        and the images, about 20 minutes cold) in the background, at idle priority, while lint and the first
#        tests run; a test that needs one of those parts waits for it (hack/testbed/process.py, `cached`).
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
if ! command -v uv >/dev/null 2>&1; then
  echo "[setup] installing uv from PyPI" >&2
  python3 -m pip install -q uv
fi
uv sync --frozen --quiet
echo "[setup] python env ready ($(.venv/bin/python --version), $((SECONDS - t0))s)" >&2
export PATH="$PWD/.venv/bin:$PATH"
if [ "${1:-}" != test ]; then
  exec hack/provision.sh "${@:-all}"
fi
hack/provision.sh early
cache=${CHSINK_CACHE:-$HOME/.cache/chsink}
mkdir -p "$cache"
rm -f "$cache/provision-late.rc"
exec 9>"$cache/provision-late.lock"
flock -x 9  # taken before the background starts: a test cannot look before it holds it
setsid bash -c 'nice -n 19 ionice -c 3 hack/provision.sh late >"$0/provision-late.log" 2>&1; echo $? >"$0/provision-late.rc"' \
  "$cache" </dev/null >/dev/null 2>&1 &
echo "[setup] the Kubernetes parts and images build in the background: $cache/provision-late.log" >&2
