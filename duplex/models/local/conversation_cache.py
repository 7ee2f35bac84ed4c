"""Conversation KV kept between turns, so a session's next turn prefills only what is new.

After a turn completes, the thinker saves the token ids its slot computed (persona, history,
the user line, the reply) with their K/V. The next turn's prompt starts with the same tokens as
long as no old turn was dropped for the history budget, so only the new user line (and the
reply's re-tokenized tail, if it differs) is prefilled. Entries are immutable tensors: a plan
may hold one while a newer turn replaces it. Bounded by session count (LRU).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from duplex.runtime.contract import KVPrefix


@dataclass(frozen=True)
class CachedConversation:
    tokens: tuple[int, ...]
    kv: KVPrefix

    def reusable(self, tokens: list[int]) -> int:
        """How many leading positions of ``tokens`` this entry's K/V already holds."""
        limit = min(len(self.tokens), len(tokens))
        for index in range(limit):
            if self.tokens[index] != tokens[index]:
                return index
        return limit

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.kv)


class ConversationCache:
    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._entries: OrderedDict[str, CachedConversation] = OrderedDict()

    def get(self, session_id: str) -> CachedConversation | None:
        entry = self._entries.get(session_id)
        if entry is not None:
            self._entries.move_to_end(session_id)
        return entry

    def put(self, session_id: str, entry: CachedConversation) -> None:
        if self.max_sessions <= 0:
            return
        self._entries[session_id] = entry
        self._entries.move_to_end(session_id)
        while len(self._entries) > self.max_sessions:
            self._entries.popitem(last=False)

    def trim(self, session_id: str, tokens: list[int]) -> None:
        """Keep only the entry's positions that ``tokens`` (what the history now says) starts with;
        the K/V of anything the history no longer holds is freed."""
        entry = self._entries.get(session_id)
        if entry is None:
            return
        keep = entry.reusable(tokens)
        if keep < len(entry.tokens):
            kv = [(k[:, :keep].clone(), v[:, :keep].clone()) for k, v in entry.kv]
            self._entries[session_id] = CachedConversation(entry.tokens[:keep], kv)

    def forget(self, session_id: str) -> None:
        self._entries.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(entry.nbytes for entry in self._entries.values())
