"""The composition root: the one room that knows every other. It builds the runtime (the
coordinator and the model families' builders), the session manager over the runtime adapter, and
the edges (HTTP, WebRTC, SIP, Twilio), and stops them in order. Nothing imports it but the CLI."""
