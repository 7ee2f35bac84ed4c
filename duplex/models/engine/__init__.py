"""The ``engine`` family: a thinker stage that streams from an OpenAI-compatible engine."""
