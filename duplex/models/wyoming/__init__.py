"""The ``wyoming`` family: ASR and TTS stages that call speech servers speaking the Wyoming protocol."""
