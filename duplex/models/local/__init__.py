"""The embedded default voice pipeline: streaming Whisper ASR -> Gemma 3 270M -> Piper TTS."""
