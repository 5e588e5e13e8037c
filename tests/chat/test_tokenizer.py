"""The committed tokenizer files (flint_backend/tokenizer/): ids of the chat tags, decoding with
and without special tokens, and lossless round trips of arbitrary text."""

import json
import random

import pytest

from flint_backend.tokenizer import ADDED_TOKENS, STOP_TOKENS, TOKENIZER_DIR, VOCAB_SIZE, load_tokenizer

# written out by hand: these ids are part of the checkpoint format (embedding rows, stop ids)
TAG_IDS = {
    "<|endoftext|>": 8175, "[gMASK]": 8176, "<sop>": 8177, "<|system|>": 8178, "<|user|>": 8179,
    "<|assistant|>": 8180, "<|observation|>": 8181, "<think>": 8182, "</think>": 8183,
    "<tool_call>": 8184, "</tool_call>": 8185, "<arg_key>": 8186, "</arg_key>": 8187,
    "<arg_value>": 8188, "</arg_value>": 8189, "<tool_response>": 8190, "</tool_response>": 8191,
}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def encode(tok, text):
    return tok(text, add_special_tokens=False).input_ids


def test_vocabulary_size(tok):
    data = json.loads((TOKENIZER_DIR / "tokenizer.json").read_text(encoding="utf-8"))
    assert len(data["model"]["vocab"]) == VOCAB_SIZE - len(ADDED_TOKENS) == 8175
    assert [(t["content"], t["id"]) for t in data["added_tokens"]] == list(TAG_IDS.items())
    assert len(tok) == VOCAB_SIZE == 8192
    assert list(TAG_IDS) == list(ADDED_TOKENS)


def test_config(tok):
    assert tok.eos_token == tok.pad_token == "<|endoftext|>"
    assert tok.eos_token_id == 8175
    assert tok.model_max_length == 262144
    assert [tok.convert_tokens_to_ids(t) for t in STOP_TOKENS] == [8175, 8179, 8181]


@pytest.mark.parametrize("tag", list(TAG_IDS))
def test_tag_is_one_token_anywhere(tok, tag):
    tag_id = TAG_IDS[tag]
    assert encode(tok, tag) == [tag_id]
    # glued to words, after a space, twice in a row: never split, never absorbs a neighbour
    ids = encode(tok, f"abc{tag}def {tag}{tag}\n")
    assert ids.count(tag_id) == 3
    assert tok.decode(ids) == f"abc{tag}def {tag}{tag}\n"
    assert tok.convert_ids_to_tokens(ids[ids.index(tag_id) + 2 :][:3]) == ["Ġ", tag, tag]


def test_prompt_starts_with_special_ids(tok):
    ids = tok("[gMASK]<sop><|user|>hi").input_ids  # add_special_tokens=True adds nothing
    assert ids[:3] == [8176, 8177, 8179]
    assert tok.decode(ids[3:]) == "hi"


def test_skip_special_tokens_keeps_think_and_tool_tags(tok):
    text = (
        "[gMASK]<sop><|system|>S<|user|>hi<|assistant|><think>hmm</think>ok"
        "<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>"
        "<|observation|><tool_response>r</tool_response><|endoftext|>"
    )
    ids = encode(tok, text)
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == (
        "Shi<think>hmm</think>ok<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>"
        "<tool_response>r</tool_response>"
    )


def random_text(rng: random.Random, n: int) -> str:
    ranges = [
        (0x00, 0x7F), (0x80, 0x7FF), (0x3040, 0x30FF), (0x4E00, 0x9FFF),  # ASCII, 2-byte, kana, CJK
        (0xAC00, 0xD7A3), (0x1F300, 0x1FAFF), (0x0300, 0x036F), (0xE000, 0xF8FF),  # Hangul, emoji, marks, PUA
        (0x10000, 0x10FFFF),  # any 4-byte code point (no surrogates: those are not text)
    ]
    chars = []
    for _ in range(n):
        lo, hi = rng.choice(ranges)
        chars.append(chr(rng.randint(lo, hi)))
    return "".join(chars)


def test_round_trip_random_unicode(tok):
    rng = random.Random(1234)
    for _ in range(200):
        text = random_text(rng, rng.randint(1, 64))
        assert tok.decode(encode(tok, text)) == text


@pytest.mark.parametrize("text", [
    " leading and trailing spaces ", "\t\ttabs\r\nCRLF\n\n\n", "東京は晴れ、上海は多云。", "👨‍👩‍👧‍👦🇯🇵👍🏽",
    "1234567 + 89 = 1234656", "def f(x):\n    return x ** 2  # 二乗\n", "\x00\x01\x7f",
])
def test_round_trip_examples(tok, text):
    assert tok.decode(encode(tok, text)) == text


def test_pre_tokenizer_splits_digits_in_groups_of_three(tok):
    pieces = [p for p, _ in tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str("x=1234567 it's")]
    assert pieces == ["x", "=", "123", "456", "7", "Ġit", "'s"]
