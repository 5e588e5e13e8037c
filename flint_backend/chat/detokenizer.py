"""Incremental detokenisation of one request's output: token ids in, text deltas out.

The deltas of `push()` and `flush()` concatenate to exactly
`tokenizer.decode(all_ids, skip_special_tokens=...)`. The technique is vLLM's
`detokenize_incrementally`: decode a window of already-emitted "prefix" tokens together
with the new ones and emit the difference, so a decoder that treats the first token of a
text specially (a leading space) sees the new tokens in context; and hold text back
while it ends in U+FFFD, since byte-level BPE splits one UTF-8 character over several
tokens and a partial character decodes to U+FFFD.

The window stays small. A token boundary p of the window is a character boundary when
decode(w[:p]) + decode(w[p:]) == decode(w): in lossy UTF-8 decoding that holds exactly
when p cuts no character (nor invalid sequence), and then no later byte can change the
text before p. So when the text ends in U+FFFD, the text up to the last such boundary
among the pending tokens is emitted anyway. A character has at most 4 bytes, so at most
3 consecutive token boundaries lie inside one, as long as every token starts at a
character start or holds continuation bytes only (true of our vocabulary;
tests/chat/test_detokenizer.py checks it): of the last 4 boundaries one is a character
boundary, and no more than 4 tokens are ever held. (Holding while the text ends in
U+FFFD, as vLLM does, would let a run of invalid bytes, e.g. from a random-weight
model, grow the window forever.) Each push decodes O(previous push + this push) tokens.

Ids that decode to nothing are dropped on arrival, as `tokenizer.decode` drops them:
ids >= len(tokenizer) (the model's embedding may be larger than the tokenizer), and
special ids when `skip_special_tokens` (the tags `<think>`, `<tool_call>`, ... are not
special, so they stay).
"""

from __future__ import annotations

from typing import Iterable

REPLACEMENT = "\ufffd"
BOUNDARY_CANDIDATES = 4  # of the last 4 token boundaries one is a character boundary (see above)
PROMPT_CONTEXT_TOKENS = 5  # prompt tokens kept as the first prefix, as vLLM does


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: Iterable[int] | None = None, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._vocab_size = len(tokenizer)
        self._special_ids = frozenset(i for i, t in tokenizer.added_tokens_decoder.items() if t.special)
        # _ids[:_read] is emitted; _prefix_text == decode(_ids[:_read]); the window starts at
        # a character boundary, so decode(everything) == decode(before) + decode(_ids).
        self._ids = self._kept(list(prompt_ids if prompt_ids is not None else ())[-PROMPT_CONTEXT_TOKENS:])
        self._read = len(self._ids)
        self._prefix_text = self._decode(self._ids)
        self._finished = False

    def push(self, new_ids: Iterable[int]) -> str:
        if self._finished:
            raise RuntimeError("IncrementalDetokenizer.push() called after flush()")
        self._ids.extend(self._kept(new_ids))
        if self._read == len(self._ids):
            return ""
        text = self._decode(self._ids)
        if not text.endswith(REPLACEMENT):
            return self._emit(text, len(self._ids))
        # Possibly a partial character: emit up to the last character boundary among the pending tokens.
        for p in range(len(self._ids) - 1, max(self._read, len(self._ids) - BOUNDARY_CANDIDATES - 1), -1):
            head = self._decode(self._ids[:p])
            if head + self._decode(self._ids[p:]) == text:
                return self._emit(head, p)
        return ""

    def flush(self) -> str:
        """The held tail (U+FFFD of a character the output never completed) and the end."""
        if self._finished:
            return ""
        self._finished = True
        if self._read == len(self._ids):
            return ""
        return self._emit(self._decode(self._ids), len(self._ids))

    def _emit(self, text: str, read: int) -> str:
        delta = text[len(self._prefix_text):]
        # The emitted tokens become the next prefix; what came before them is dropped.
        self._ids = self._ids[self._read:]
        self._read = read - self._read
        self._prefix_text = delta
        return delta

    def _kept(self, ids: Iterable[int]) -> list[int]:
        kept = []
        for i in ids:
            i = int(i)
            if i < 0:
                raise ValueError(f"token id: expected a non-negative integer, got {i}")
            if i < self._vocab_size and not (self._skip_special and i in self._special_ids):
                kept.append(i)
        return kept

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special) if ids else ""
