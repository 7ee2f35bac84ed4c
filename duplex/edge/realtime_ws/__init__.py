"""The OpenAI Realtime WebSocket door (``GET /v1/realtime``): its loop and its audio formats."""
