"""Guided decoding (structured outputs): a request's tokens held to a grammar, with xgrammar.

`SamplingParams.guided_json` is a JSON schema (`{"type": "object"}` for OpenAI's json_object);
the constraint starts at the first generated token, or at the one after `guided_start_token_id`
(the chat layer sets </think>'s id when the model reasons first, as vLLM's reasoning-aware
structured outputs do). `SamplingParams.structural_tag` is xgrammar's structural tag (tool calls
held to their format and their tools' schemas, serving.tool_constraint); it starts at the first
token and describes the reasoning itself. At each step the tokens the grammar cannot take next get -inf logits
(xgrammar's token bitmask), after the penalties and before temperature and sampling; the
sampled token then advances the request's matcher. Once the JSON is complete only the stop
tokens remain (with ignore_eos, what follows the stop token is free). Output has one layout
(", " and ": " between items, no other whitespace, which a sampler could extend without end).
Logprobs stay those of the raw distribution.

The tokenizer and xgrammar load on the first guided request (xgrammar is imported there, so an
engine that never sees one does not need it). A schema xgrammar cannot compile is refused at
admission, naming guided_json. Guided requests sample on the host (no async launch ahead).
"""

from __future__ import annotations

import json
import threading
import weakref

import torch

from flint_backend.engine.sequence import Sequence

MAX_CACHED_SCHEMAS = 256


class GuidedSchemaError(ValueError):
    """A guided_json schema that cannot be compiled; the message names the field."""


def is_guided(seq: Sequence) -> bool:
    return seq.params.guided_json is not None or seq.params.structural_tag is not None


def _active(seq: Sequence) -> bool:
    """Whether seq's constraint has begun: guided, and past its start token if it has one."""
    if seq.params.structural_tag is not None:
        return True
    start = seq.params.guided_start_token_id
    return is_guided(seq) and (start is None or start in seq.output_ids)


def grammar_key(params) -> tuple[str, str]:
    """(kind, canonical JSON) of a guided request's grammar."""
    if params.structural_tag is not None:
        return "structural_tag", json.dumps(params.structural_tag, sort_keys=True)
    return "guided_json", json.dumps(params.guided_json, sort_keys=True)


class GuidedDecoding:
    def __init__(self, tokenizer_path: str, vocab_size: int, stop_ids: frozenset[int]):
        self._tokenizer_path, self._vocab_size, self._stop_ids = tokenizer_path, vocab_size, sorted(stop_ids)
        self._lock = threading.Lock()  # requests are checked on the callers' threads
        self._compiler = None
        self._grammars: dict[str, object] = {}
        self._matchers: weakref.WeakKeyDictionary[Sequence, object] = weakref.WeakKeyDictionary()

    def _load(self):
        if self._compiler is None:
            import xgrammar

            from flint_backend.tokenizer import load_tokenizer

            info = xgrammar.TokenizerInfo.from_huggingface(load_tokenizer(self._tokenizer_path),
                                                           vocab_size=self._vocab_size,
                                                           stop_token_ids=self._stop_ids or None)  # None: its eos
            self._compiler = xgrammar.GrammarCompiler(info)
        return self._compiler

    def grammar(self, params):
        """The compiled grammar of a request's guided_json or structural_tag (cached, at most
        MAX_CACHED_SCHEMAS); raises GuidedSchemaError naming the field."""
        key = grammar_key(params)
        kind, text = key
        with self._lock:
            if key not in self._grammars:
                try:
                    compiler = self._load()
                    compiled = (compiler.compile_structural_tag(text) if kind == "structural_tag"
                                else compiler.compile_json_schema(text, any_whitespace=False))
                except Exception as error:  # noqa: BLE001 - xgrammar's errors name no field
                    what = "a structural tag" if kind == "structural_tag" else "a JSON schema"
                    raise GuidedSchemaError(f"{kind}: not {what} xgrammar can compile: "
                                            f"{str(error).splitlines()[0][:300]}") from None
                if len(self._grammars) >= MAX_CACHED_SCHEMAS:
                    self._grammars.pop(next(iter(self._grammars)))
                self._grammars[key] = compiled
            return self._grammars[key]

    def mask(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        """logits [S, V], one row per seq: -inf in place for what each constrained row cannot take."""
        import xgrammar

        constrained = [(row, m) for row, seq in enumerate(seqs)
                       if (m := self._matcher(seq)) is not None and not m.is_terminated()]
        if not constrained:
            return
        bitmask = xgrammar.allocate_token_bitmask(len(constrained), self._vocab_size)
        for i, (_, matcher) in enumerate(constrained):
            matcher.fill_next_token_bitmask(bitmask, i)
        rows = [row for row, _ in constrained]
        masked = logits[rows]
        xgrammar.apply_token_bitmask_inplace(masked, bitmask.to(logits.device), vocab_size=self._vocab_size)
        logits[rows] = masked

    def accept(self, seqs: list[Sequence], tokens: list[int]) -> None:
        """The tokens sampled for seqs (after mask() saw them): each constrained one advances its matcher."""
        for seq, token in zip(seqs, tokens):
            matcher = self._matchers.get(seq)
            if matcher is not None and not matcher.is_terminated():
                matcher.accept_token(token)

    def _matcher(self, seq: Sequence):
        """seq's matcher once its constraint has begun (made then), else None."""
        if seq not in self._matchers:
            if not _active(seq):
                return None
            import xgrammar

            # the request's own stop tokens end the JSON
            self._matchers[seq] = xgrammar.GrammarMatcher(self.grammar(seq.params),
                                                          override_stop_tokens=sorted(seq.stop_ids) or None)
        return self._matchers[seq]
