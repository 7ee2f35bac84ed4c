"""The seam the phone doors (SIP, Twilio) share: a call reaches a conversation from
``duplex.session`` through ``bridge.CallAgent``; ``session_agent`` makes those agents from the
session manager. Nothing here knows a transport or a model.
"""
