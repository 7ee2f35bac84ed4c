"""The Twilio Media Streams door: a WebSocket carrying a phone call's G.711 audio as JSON messages."""
