"""Phone bridge: SIP/RTP (G.711) calls and Twilio-Media-Streams WebSockets.

Both transports end in the same place: a conversation from ``duplex.session``, reached through
``bridge.CallAgent``. Everything here is transport and codec work; nothing knows a model.
"""
