"""toy_voice: a weight-free voice pipeline (measure -> reply text -> synthetic syllables)."""
