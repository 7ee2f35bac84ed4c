"""Media pieces the doors share: G.711, phone-rate audio conversion, RTP packets and a jitter
buffer. Codec and packet work only: nothing here knows a session."""
