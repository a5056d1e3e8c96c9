#!/usr/bin/env bash
# Creates the Python environment (uv, locked) and provisions the test bed. Safe to re-run.
# Usage: hack/setup.sh [PART...]: the parts of hack/provision.sh (default: all; `demo`: only what the demo needs).
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
if ! command -v uv >/dev/null 2>&1; then
  echo "[setup] installing uv from PyPI" >&2
  python3 -m pip install -q uv
fi
uv sync --frozen --quiet
echo "[setup] python env ready ($(.venv/bin/python --version), $((SECONDS - t0))s)" >&2
PATH="$PWD/.venv/bin:$PATH" hack/provision.sh "${@:-all}"
