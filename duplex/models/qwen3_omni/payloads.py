"""What passes between the qwen3_omni stages, and what of it reaches the client.

    encoder  --AudioEmbeds-->  thinker  --ThinkerStep-->  talker  --CodecChunk-->  code2wav
                                  |  (client: its TextToken)                          |
                                  v                                                   v
                              TextToken (an AgentText)                   VocodedAudio (an AgentAudio)

Tensors ride as fields (the codec ships them zero-copy); the structs are ``contract.Payload``s,
so every stage gets them back as themselves. Kept light (no torch import): the registry imports
this module in every process, the coordinator's too, which decodes the terminal outputs.
"""

from __future__ import annotations

from typing import Any

import msgspec

from duplex.runtime.contract import AgentAudio, AgentText, Payload


class AudioEmbeds(Payload, tag="qwen3_omni.AudioEmbeds"):
    """One encoded window of the caller's audio."""

    embeds: Any  # torch (n, hidden) float32
    floor_moved: int = 0  # windows shipped before a louder part moved the mel floor (encoder.py)


class TextToken(AgentText, tag="qwen3_omni.TextToken"):
    """A reply token as the client sees it: its text delta and its id."""

    token_ids: list[int] = msgspec.field(default_factory=list)


class TalkerPrefix(msgspec.Struct):
    """The thinker's view of the turn that the talker's prefill needs (first step only)."""

    user_embeds: Any  # torch (n_user, hidden)
    user_hidden: Any  # torch (n_user, hidden): the accept_hidden_layer states
    user_mm: Any  # torch bool (n_user,): multimodal (audio) positions
    assistant_embeds: Any  # torch (3, hidden): the assistant header
    tts_embeds: Any  # torch (3, hidden): tts_bos, tts_eos, tts_pad


class ThinkerStep(Payload, tag="qwen3_omni.ThinkerStep"):
    """One reply token for the talker: its embedding (and, first, the turn's prefix)."""

    token: TextToken
    embeds: Any  # torch (1, hidden) float32
    talker_prefix: TalkerPrefix | None = None

    def for_client(self) -> TextToken:
        return self.token


class CodecChunk(Payload, tag="qwen3_omni.CodecChunk"):
    """Talker frames for the vocoder: all 16 codebooks of frames [start, start + n)."""

    codes: Any  # np.int64 (groups, n)
    start: int


class VocodedAudio(AgentAudio, tag="qwen3_omni.VocodedAudio"):
    """A waveform chunk, with the codec frames it was decoded from."""

    codes: Any = None  # np.int64 (groups, n)
    start: int = 0
