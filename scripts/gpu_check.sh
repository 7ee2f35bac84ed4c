#!/usr/bin/env bash
# The device check: one command on a bare GPU machine (Python 3.12, torch with CUDA, transformers,
# numpy, pytest, psutil, pyyaml, prometheus-client, httpx, matplotlib; no internet, none of
# duplex's other packages). It installs the missing wheels from .whl/ (pyzmq, msgspec, pydantic
# and its parts), then, each step under its own timeout and each writing its result as it ends:
#   1. probes what the sandbox allows (CUDA IPC between processes, CUDA graphs): probe.json
#   2. the GPU tests (tests/gpu): tests.txt
#   3. `duplex bench pipeline` on the real-size config at 1, 8 and 16 concurrent turns, staged vs
#      fused: results.json, bench.png
#   4. summary.md from all of it
# into $OUT (default ./gpu-check-out), with the whole log in $OUT/log.txt.
#
#   bash scripts/gpu_check.sh                 # on the GPU machine
#   bash scripts/gpu_check.sh --cpu-dry-run   # here: the same steps on the CPU with the tiny model,
#                                             # up to the first CUDA call (GPU tests skip)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY=0
[[ "${1:-}" == "--cpu-dry-run" ]] && DRY=1
OUT=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
LOG=$OUT/log.txt
PY=${PYTHON:-python3}
# Step budgets (seconds): they sum to about 6 minutes on one H200.
T_PROBE=${T_PROBE:-40} T_TESTS=${T_TESTS:-170} T_BENCH=${T_BENCH:-250}
# Which steps to run (a rerun may skip what already passed): probe tests bench.
ONLY=${ONLY:-probe tests bench}
TESTS=${TESTS:-tests/gpu}
wants() { [[ " $ONLY " == *" $1 "* ]]; }

say() { echo "== [$(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }
step() {  # step NAME SECONDS CMD...: run under a timeout, log it, never stop the script
    local name=$1 seconds=$2
    shift 2
    say "$name (timeout ${seconds}s): $*"
    local start=$SECONDS
    timeout --kill-after=10 "$seconds" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    say "$name: rc $rc in $((SECONDS - start)) s"
    echo "$name $rc $((SECONDS - start))" >> "$OUT/steps.txt"
}

: > "$LOG"
: > "$OUT/steps.txt"
say "gpu_check: dry=$DRY out=$OUT"
if [[ $DRY == 1 ]]; then
    PY=${PYTHON:-$ROOT/.venv/bin/python}
    # The wheels must cover what the runtime imports; here they are checked, not installed (cp312).
    for name in pyzmq msgspec pydantic pydantic_core annotated_types typing_inspection typing_extensions; do
        ls "$ROOT"/.whl/"$name"-*.whl > /dev/null 2>&1 || say "MISSING wheel: $name"
    done
    BENCH=(--config omni-tiny --device cpu --concurrency 1,2 --min-turns 2 --warmup 1 --aborts 2
           --thinker-tokens 6 --talker-frames 8)
    # Packages the GPU machine lacks fail to import here too, so the dry run proves the check's
    # import path does without them (the bench's stage processes inherit PYTHONPATH).
    BLOCK=$(mktemp -d /tmp/gpu-check-block.XXXX)
    for name in aiortc aioice av fastapi uvicorn webrtcvad openai sglang vllm; do
        mkdir -p "$BLOCK/$name"
        echo "raise ImportError('$name: not on the GPU machine (gpu_check --cpu-dry-run)')" > "$BLOCK/$name/__init__.py"
    done
    export PYTHONPATH=$BLOCK
else
    step install 60 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$ROOT"/.whl/*.whl
    export PYTHONPATH=/tmp/site
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>&1 | tee -a "$LOG"
    BENCH=(--config omni-real --device cuda:0 --concurrency 1,8,16 --min-turns 8 --warmup 1,16 --aborts 9
           --audio-seconds 1.5 --thinker-tokens 12 --talker-frames 25)
fi
export PYTHONPATH=$ROOT:$ROOT/tools${PYTHONPATH:+:$PYTHONPATH}
"$PY" -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__,
'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tee -a "$LOG"

if wants probe && [[ -f scripts/gpu_probe.py ]]; then
    say "probe -> probe.json"
    timeout --kill-after=5 "$T_PROBE" "$PY" scripts/gpu_probe.py > "$OUT/probe.json" 2>> "$LOG"
    echo "probe $? 0" >> "$OUT/steps.txt"
    cat "$OUT/probe.json" | tee -a "$LOG"
fi
# --confcutdir: tests/conftest.py serves the WebRTC tests and imports aiortc, absent there.
if [[ $DRY == 0 && -s "$OUT/probe.json" ]] && ! "$PY" -c "import json, sys
sys.exit(0 if json.load(open(sys.argv[1])).get('cuda_ipc', {}).get('ok') else 1)" "$OUT/probe.json"; then
    say "CUDA IPC unavailable here: the bench's stages hand tensors over through host memory"
    BENCH+=(--relay.cuda_ipc=false)
fi
wants tests && step tests "$T_TESTS" "$PY" -m pytest -q -s -rs -p no:cacheprovider --confcutdir=tests/gpu \
    $TESTS -o addopts="" --junitxml="$OUT/tests.xml"
wants bench && step bench "$T_BENCH" "$PY" -m duplex_tools.bench.pipeline "${BENCH[@]}" \
    --json "$OUT/results.json" --plot "$OUT/bench.png"
"$PY" scripts/gpu_summary.py "$OUT" 2>&1 | tee -a "$LOG"
say "gpu_check done"
