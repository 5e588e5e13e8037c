"""Logprob entries: each token's text and bytes, against the tokenizer's own decoding."""

import pytest

from flint_backend.chat.token_logprobs import LOGPROB_FLOOR, TokenLogprobEntries, byte_alphabet
from flint_backend.tokenizer import ADDED_TOKENS, VOCAB_SIZE, load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def entries(tokenizer):
    return TokenLogprobEntries(tokenizer)


def test_the_byte_alphabet_spells_every_byte_once():
    alphabet = byte_alphabet()
    assert sorted(alphabet.values()) == list(range(256))
    assert alphabet["A"] == 65 and alphabet["Ġ"] == 32 and alphabet["Ċ"] == 10


def test_every_tokens_text_is_what_the_tokenizer_decodes(tokenizer, entries):
    for token_id in range(len(tokenizer)):
        text, raw = entries.token(token_id)
        assert text == tokenizer.decode([token_id], skip_special_tokens=False), token_id
        if "\ufffd" not in text:
            assert bytes(raw).decode("utf-8") == text, token_id


def test_the_bytes_of_a_split_character_join_into_it(tokenizer, entries):
    text = "naïve café ünïcode 日本語"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert any("\ufffd" in entries.token(i)[0] for i in ids)  # some token holds part of a character
    assert bytes(b for i in ids for b in entries.token(i)[1]).decode("utf-8") == text


def test_added_tokens_are_their_own_text_and_unknown_ids_are_empty(entries):
    first_added = VOCAB_SIZE - len(ADDED_TOKENS)
    assert entries.token(first_added) == ("<|endoftext|>", list(b"<|endoftext|>"))
    assert entries.token(VOCAB_SIZE - 1) == ("</tool_response>", list(b"</tool_response>"))
    assert entries.token(VOCAB_SIZE + 5) == ("", [])


def test_entries_carry_the_top_logprobs_and_clamp_minus_infinity(tokenizer, entries):
    (the,), (of,) = (tokenizer(s, add_special_tokens=False).input_ids for s in (" the", " of"))
    got = entries.entries([the, of], [[-0.25, [[the, -0.25], [of, -2.0]]], [float("-inf"), []]])
    assert got == [
        {"token_id": the, "token": " the", "bytes": list(b" the"), "logprob": -0.25, "top_logprobs": [
            {"token_id": the, "token": " the", "bytes": list(b" the"), "logprob": -0.25},
            {"token_id": of, "token": " of", "bytes": list(b" of"), "logprob": -2.0}]},
        {"token_id": of, "token": " of", "bytes": list(b" of"), "logprob": LOGPROB_FLOOR, "top_logprobs": []}]
    with pytest.raises(ValueError, match="logprobs: 1 entries for 2 tokens"):
        entries.entries([the, of], [[-0.25, []]])
