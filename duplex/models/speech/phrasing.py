"""What the TTS stages of the ``speech`` family share, whatever protocol reaches the server: the
reply's text cut into phrases as the in-process TTS cuts them (``contract.PhraseSplitter``: the
first at "Sure," so the first audio comes early), and the queue that hands each phrase, once it is
sent, to the part that reads its audio back. Nothing here imports a protocol's client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from duplex.runtime.contract import AgentText, PhraseSplitter, Request, TurnRequest, WorkItem


@dataclass(frozen=True)
class TTSSettings:
    connect_timeout_s: float = 3.0
    stall_timeout_s: float = 10.0  # no data from the server for this long, while audio is owed
    first_clause_words: int = 1
    clause_words: int = 4

    def splitter(self) -> PhraseSplitter:
        return PhraseSplitter(first_clause_words=self.first_clause_words, clause_words=self.clause_words)


@dataclass
class Start:
    """The reply's first cut phrases, the splitter holding the rest, and whether the text ended."""

    phrases: list[str]
    splitter: PhraseSplitter
    ended: bool


async def first_phrase(settings: TTSSettings, inputs: AsyncIterator[WorkItem]) -> Start | None:
    """Read the text until the first phrase is cut (no connection is opened for a reply with
    nothing to say)."""
    splitter = settings.splitter()
    async for item in inputs:
        cut = phrases(splitter, item)
        if cut:
            return Start(cut, splitter, item.eos)
    return None


def phrases(splitter: PhraseSplitter, item: WorkItem) -> list[str]:
    cut = splitter.push(item.data.text) if isinstance(item.data, AgentText) else []
    return cut + splitter.flush() if item.eos else cut


async def next_phrase(queue: asyncio.Queue[str | None], sender: asyncio.Task[None]) -> str | None:
    """The next phrase sent, or None at the end; a sender that failed raises its error here."""
    getter = asyncio.ensure_future(queue.get())
    try:
        await asyncio.wait({getter, sender}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not getter.done():
            getter.cancel()
    if getter.done() and not getter.cancelled():
        return getter.result()
    sender.result()  # raises the sender's error
    return await queue.get()  # the sender ended: its end marker is queued


async def turn_to_voice(request: Request, inputs: AsyncIterator[WorkItem]) -> TurnRequest | None:
    """The turn whose reply is to be voiced; else None, once ``inputs`` is drained (a session's
    end, a text-only reply: the stage must still consume what the thinker sends)."""
    if isinstance(request, TurnRequest) and request.output_audio:
        return request
    async for _ in inputs:
        pass
    return None
