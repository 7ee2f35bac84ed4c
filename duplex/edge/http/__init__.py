"""The HTTP front: the FastAPI app, access (keys, client secrets), Host/Origin and rate guards,
WebRTC signalling, health and stats routes, and the connection limits of the HTTP server. It
mounts the doors that arrive over HTTP (WebRTC signalling, the Realtime WebSocket)."""
