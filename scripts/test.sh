#!/usr/bin/env bash
# Sets up everything the tests need, checks the layer contracts, lint and types (scripts/lint.sh),
# then runs the whole suite (slow end-to-end tests included). The serve-path tests also make
# .venv-serve with exactly what scripts/serve.sh installs (~65 s the first time, then ~5 s) and a
# temporary venv for the built wheel (~65 s, removed after).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test --local
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
bash scripts/lint.sh
set +e
python -m pytest -q -rs "$@"
rc=$?
set -e
# pytest exits 5 when it collected nothing: that is a failure here, never a pass.
if [ "$rc" = 5 ]; then echo "no tests were collected" >&2; exit 1; fi
exit "$rc"
