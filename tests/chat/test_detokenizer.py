"""IncrementalDetokenizer against the full `tokenizer.decode`: random token sequences (multi-byte
characters, emoji, CJK, special and tag tokens, unknown ids) pushed in random groups."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers.convert_slow_tokenizer import bytes_to_unicode

from flint_backend.chat.detokenizer import IncrementalDetokenizer
from flint_backend.tokenizer import ADDED_TOKENS, VOCAB_SIZE, load_tokenizer

TOKENIZER = load_tokenizer()
SPECIAL_IDS = list(range(8175, 8182))
TAG_IDS = list(range(8182, 8192))
MODEL_VOCAB = 151552  # GLM-4.x's embedding rows: ids past our tokenizer can come out of a model
CHAR_OF_BYTE = bytes_to_unicode()
BYTE_OF_CHAR = {c: b for b, c in CHAR_OF_BYTE.items()}


def encode(text):
    return TOKENIZER(text, add_special_tokens=False).input_ids


def token_bytes(token_id):
    return bytes(BYTE_OF_CHAR[c] for c in TOKENIZER.convert_ids_to_tokens(token_id))


def run(ids, groups, skip_special_tokens=True, prompt_ids=None):
    """The deltas, checking on the way that the text so far is always a prefix of the final text."""
    final = TOKENIZER.decode(ids, skip_special_tokens=skip_special_tokens)
    detok = IncrementalDetokenizer(TOKENIZER, prompt_ids, skip_special_tokens)
    deltas, start = [], 0
    for size in groups:
        deltas.append(detok.push(ids[start:start + size]))
        start += size
        so_far = "".join(deltas)
        assert final.startswith(so_far)
        seen = TOKENIZER.decode(ids[:start], skip_special_tokens=skip_special_tokens)
        if not seen.endswith("\ufffd"):
            assert so_far == seen  # nothing held back without a reason
    deltas.append(detok.flush())
    return deltas, final


TEXTS = ["Hello, world!", " leading space", "  two", "東京は晴れ", "😀🎉 emoji", "é à ü ß", "한국어",
         "mixed 漢字 and 😀 text", "\n\n", "—“quotes”—", "\ufffd literal replacement", "a\u0301 combining"]


@st.composite
def token_pieces(draw):
    kind = draw(st.sampled_from(["text", "text", "random_text", "special", "tag", "any", "unknown", "bytes"]))
    if kind == "text":
        return encode(draw(st.sampled_from(TEXTS)))
    if kind == "random_text":
        return encode(draw(st.text(min_size=1, max_size=12)))
    if kind == "special":
        return [draw(st.sampled_from(SPECIAL_IDS))]
    if kind == "tag":
        return [draw(st.sampled_from(TAG_IDS))]
    if kind == "unknown":
        return [draw(st.integers(VOCAB_SIZE, MODEL_VOCAB - 1))]
    if kind == "bytes":  # a multi-byte character cut into its single-byte tokens, or a piece of it
        char = draw(st.sampled_from("é東😀한—"))
        byte_ids = [TOKENIZER.convert_tokens_to_ids(CHAR_OF_BYTE[b]) for b in char.encode()]
        return byte_ids[draw(st.integers(0, len(byte_ids) - 1)):]
    return [draw(st.integers(0, VOCAB_SIZE - 1))]


@st.composite
def pushes(draw):
    ids = [i for piece in draw(st.lists(token_pieces(), max_size=25)) for i in piece]
    groups, left = [], len(ids)
    while left:  # at most two draws a group, so the draws end (a run of drawn 0s need not)
        if draw(st.booleans()):
            groups.append(0)  # an empty push
        groups.append(min(left, draw(st.integers(1, 6))))
        left -= groups[-1]
    return ids, groups


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pushes(), st.booleans())
def test_deltas_concatenate_to_the_full_decode(case, skip_special_tokens):
    ids, groups = case
    deltas, final = run(ids, groups, skip_special_tokens)
    assert "".join(deltas) == final


@settings(max_examples=100, deadline=None)
@given(pushes(), st.sampled_from(TEXTS))
def test_prompt_context_changes_nothing(case, prompt):
    ids, groups = case
    deltas, final = run(ids, groups, prompt_ids=encode("[gMASK]<sop><|user|>" + prompt + "<|assistant|><think>"))
    assert "".join(deltas) == final


def test_a_character_split_over_tokens_comes_out_whole():
    ids = [TOKENIZER.convert_tokens_to_ids(CHAR_OF_BYTE[b]) for b in "😀".encode()]
    detok = IncrementalDetokenizer(TOKENIZER)
    assert [detok.push([i]) for i in ids] == ["", "", "", "😀"]
    assert detok.flush() == ""


def test_leading_spaces_are_kept():
    ids = encode(" one two  three")
    detok = IncrementalDetokenizer(TOKENIZER, prompt_ids=encode("Count:"))
    assert "".join(detok.push([i]) for i in ids) + detok.flush() == " one two  three"


def test_numpy_ids_as_triton_hands_them_over():
    import numpy as np

    detok = IncrementalDetokenizer(TOKENIZER, prompt_ids=np.array(encode("Say:"), dtype=np.int32))
    assert detok.push(np.array(encode(" 東京"), dtype=np.int32)) + detok.flush() == " 東京"


def test_special_tokens_per_skip_special_tokens():
    ids = encode("hi<|user|><think>x</think><|endoftext|>")
    for skip, text in [(True, "hi<think>x</think>"), (False, "hi<|user|><think>x</think><|endoftext|>")]:
        detok = IncrementalDetokenizer(TOKENIZER, skip_special_tokens=skip)
        assert [detok.push([i]) for i in ids] + [detok.flush()] == [
            "hi", "<|user|>" * (not skip), "<think>", "x", "</think>", "<|endoftext|>" * (not skip), ""]
        assert text == TOKENIZER.decode(ids, skip_special_tokens=skip)


def test_ids_past_the_tokenizer_decode_as_nothing():
    e_acute = encode("é")  # two byte tokens
    ids = encode("a") + [VOCAB_SIZE, MODEL_VOCAB - 1] + e_acute[:1] + [VOCAB_SIZE] + e_acute[1:] + encode("b")
    assert len(e_acute) == 2 and TOKENIZER.decode(ids) == "aéb"
    detok = IncrementalDetokenizer(TOKENIZER)
    assert [detok.push([i]) for i in ids] + [detok.flush()] == ["a", "", "", "", "", "é", "b", ""]


def test_unfinished_character_is_flushed_as_the_full_decode_has_it():
    ids = encode("ok") + [TOKENIZER.convert_tokens_to_ids(CHAR_OF_BYTE[0xE6])]
    detok = IncrementalDetokenizer(TOKENIZER)
    assert detok.push(ids) == "ok"
    assert detok.flush() == "\ufffd" == TOKENIZER.decode(ids)[-1]
    with pytest.raises(RuntimeError, match="after flush"):
        detok.push([1])


def test_negative_ids_are_an_error():
    with pytest.raises(ValueError, match="token id: expected a non-negative integer, got -1"):
        IncrementalDetokenizer(TOKENIZER).push([-1])


def test_every_token_starts_a_character_or_continues_one():
    """What bounds the held tail (see detokenizer.py): no token ends one character and starts another
    in its first byte's middle, i.e. a token's leading continuation bytes are all its bytes."""
    for token_id in range(VOCAB_SIZE - len(ADDED_TOKENS)):
        data = token_bytes(token_id)
        leading = len(data) - len(data.lstrip(bytes(range(0x80, 0xC0))))
        assert leading in (0, len(data)), (token_id, data)


class CountingTokenizer:
    """Records how many ids each decode() call gets."""

    def __init__(self, tokenizer):
        self.tokenizer, self.sizes = tokenizer, []
        self.added_tokens_decoder = tokenizer.added_tokens_decoder

    def __len__(self):
        return len(self.tokenizer)

    def decode(self, ids, **kwargs):
        self.sizes.append(len(ids))
        return self.tokenizer.decode(ids, **kwargs)


@pytest.mark.parametrize("source", ["text", "random ids", "invalid bytes"])
def test_work_per_push_is_bounded(source):
    rng = random.Random(0)
    if source == "text":
        ids = encode("".join(rng.choice(TEXTS) for _ in range(4000)))[:20000]
    elif source == "random ids":
        ids = [rng.randrange(MODEL_VOCAB if rng.random() < 0.1 else VOCAB_SIZE) for _ in range(20000)]
    else:  # lone continuation bytes: the text ends in U+FFFD after every token
        ids = [TOKENIZER.convert_tokens_to_ids(CHAR_OF_BYTE[rng.randrange(0x80, 0xC0)]) for _ in range(20000)]
    counting = CountingTokenizer(TOKENIZER)
    detok = IncrementalDetokenizer(counting)
    text = "".join(detok.push([i]) for i in ids) + detok.flush()
    assert text == TOKENIZER.decode(ids, skip_special_tokens=True)
    # a window holds the last emitted batch and the pending tokens, each at most 4 held + 1 pushed
    assert max(counting.sizes) <= 10
    assert sum(counting.sizes) <= 15 * len(ids)
