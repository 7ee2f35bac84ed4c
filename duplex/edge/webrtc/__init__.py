"""The WebRTC door (aiortc): the gateway that answers offers, the peer and its audio tracks, and
the media worker processes (and their pool) that can hold the peers off the server's loop.
``offer.py`` only vets an offer before aiortc parses it; the SIP door's ``sdp.py`` negotiates."""
