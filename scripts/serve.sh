#!/usr/bin/env bash
# Sets up duplex with the embedded default's model packages, then serves it: `duplex serve`.
# Extra arguments go to `duplex serve` (e.g. --port 8080, --config omni-tiny).
# The environment is .venv, or the folder DUPLEX_VENV names (see scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --local
. "${DUPLEX_VENV:-.venv}/bin/activate"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec duplex serve "$@"
