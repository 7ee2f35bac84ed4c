"""The SIP door: a UAS (RFC 3261 transactions, dialogs, digest access, anti-amplification) and
each call's RTP media; ``sdp.py`` is its G.711 offer/answer. Calls reach sessions through
``edge/phone``'s call agent."""
