"""A turn-taking corpus that is not the project's voice, made here at run time (no downloads):
synthetic speakers (espeak-ng voices and variants across accents, rates and pitches; Piper's
``joe`` voice with varied length and noise scales and sox pitch shifts), backchannels, noises,
real interruptions and mid-sentence pauses, each under clean, noisy (20 and 10 dB SNR), room and
phone-line conditions (``spec.py``). Its clips are fed through the session's own decisions in
process (``today.py``) and through a small classifier trained on the development part
(``train.py``, ``decide.py``). A synthetic corpus is a floor, not proof of hearing real callers."""
