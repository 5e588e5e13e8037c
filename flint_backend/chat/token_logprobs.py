"""Log probabilities of generated tokens as clients read them: each token with its text and bytes.

The engine reports, for each generated token, its logprob and the top-N (token id, logprob)
pairs of the model's raw distribution (engine.sampler.TokenLogprobs). Clients want text:
OpenAI's chat format gives each entry `token` (the token's text), `bytes` (its UTF-8 bytes:
a byte-level BPE token may hold part of a character, whose bytes are not valid UTF-8 on their
own and whose text then holds U+FFFD), `logprob` and `top_logprobs` in the same form. The
entries here are that, plus `token_id`. Prompt tokens have entries of the same form; the first
prompt token's `logprob` is None (null): nothing precedes it.

A byte-level BPE token's string (convert_ids_to_tokens) spells its bytes with GPT-2's byte
alphabet (printable bytes as themselves, the other 68 as the characters from U+0100 on); its
text is those bytes decoded as UTF-8 with U+FFFD for what is not, which is what
`tokenizer.decode([id])` gives. Added tokens (the chat tags) are their own text. An id the
tokenizer does not have (the model's embedding may be larger) has empty text and no bytes.
A logprob below LOGPROB_FLOOR (-inf: JSON has no infinities) reads as the floor, as in vLLM.
"""

from __future__ import annotations

LOGPROB_FLOOR = -9999.0


def byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: character -> the byte it spells."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in chars]
    chars.update({b: chr(256 + n) for n, b in enumerate(others)})
    return {c: b for b, c in chars.items()}


class TokenLogprobEntries:
    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._size = len(tokenizer)
        self._added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
        self._alphabet = byte_alphabet()
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def token(self, token_id: int) -> tuple[str, list[int]]:
        """(text, UTF-8 bytes) of one token."""
        if token_id not in self._cache:
            self._cache[token_id] = self._spell(token_id)
        return self._cache[token_id]

    def _spell(self, token_id: int) -> tuple[str, list[int]]:
        if not 0 <= token_id < self._size:
            return "", []
        if token_id in self._added:
            text = self._added[token_id]
            return text, list(text.encode("utf-8"))
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        if all(c in self._alphabet for c in piece):
            raw = bytes(self._alphabet[c] for c in piece)
            return raw.decode("utf-8", errors="replace"), list(raw)
        text = self._tokenizer.decode([token_id])  # not a byte-level vocabulary
        return text, list(text.encode("utf-8"))

    def entry(self, token_id: int, logprob: float) -> dict:
        text, raw = self.token(token_id)
        return {"token_id": token_id, "token": text, "bytes": raw, "logprob": max(float(logprob), LOGPROB_FLOOR)}

    def entries(self, token_ids: list[int], logprobs: list) -> list[dict]:
        """token_ids [n] and their engine logprobs [n] of (logprob, [(id, logprob), ...] best first)
        -> one entry a token, with its top_logprobs."""
        if len(token_ids) != len(logprobs):
            raise ValueError(f"logprobs: {len(logprobs)} entries for {len(token_ids)} tokens")
        return [{**self.entry(t, lp), "top_logprobs": [self.entry(int(i), v) for i, v in top]}
                for t, (lp, top) in zip(token_ids, logprobs)]

    def prompt_entries(self, prompt_logprobs: list) -> list[dict]:
        """The engine's prompt logprobs [(id, logprob, top)], the first token's logprob None (nothing
        precedes it) -> entries, that one with `logprob` None and no top_logprobs."""
        return [{**self.entry(int(t), 0.0), "logprob": None, "top_logprobs": []} if lp is None else
                self.entries([int(t)], [(lp, top)])[0] for t, lp, top in prompt_logprobs]
