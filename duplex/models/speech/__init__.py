"""The ``speech`` family: ASR and TTS stages that call speech servers: Wyoming (Home Assistant's speech
protocol, over TCP) and OpenAI-compatible ``/v1/audio/transcriptions`` (over HTTP)."""
