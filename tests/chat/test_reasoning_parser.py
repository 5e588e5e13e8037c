import random

import pytest

from flint_backend.chat.reasoning_parser import Glm47ReasoningParser, ReasoningDelta


def split(chunks, thinking=True, **options):
    parser = Glm47ReasoningParser(thinking, **options)
    deltas = [parser.feed(chunk) for chunk in chunks] + [parser.finish()]
    return "".join(d.reasoning for d in deltas), "".join(d.content for d in deltas)


@pytest.mark.parametrize("output, reasoning, content", [
    ("Let me think.</think>The answer is 4.", "Let me think.", "The answer is 4."),
    ("</think>Direct answer", "", "Direct answer"),
    ("<think>dropped opening tag</think>x", "dropped opening tag", "x"),
    ("a <think> mid-reasoning stays</think>", "a <think> mid-reasoning stays", ""),
    ("cut off before the end", "cut off before the end", ""),
    ("cut off inside the tag </thi", "cut off inside the tag </thi", ""),
    ("<thi", "<thi", ""),
    ("a < b and </the end</think>\n\nDone", "a < b and </the end", "\n\nDone"),
    ("r</think>c</think>d", "r", "c</think>d"),
    ("plan<tool_call>f<arg_key>a</arg_key></tool_call>", "plan", "<tool_call>f<arg_key>a</arg_key></tool_call>"),
    ("plan<tool_call>f</tool_call></think>after", "plan", "<tool_call>f</tool_call></think>after"),
    ("r</think>c<tool_call>f</tool_call>", "r", "c<tool_call>f</tool_call>"),
    ("", "", ""),
])
def test_thinking_on(output, reasoning, content):
    assert split([output]) == (reasoning, content)
    assert split(list(output)) == (reasoning, content)


@pytest.mark.parametrize("output, content", [
    ("Hello there", "Hello there"),
    ("</think>Hello", "Hello"),
    ("</thi", "</thi"),
    ("Hello</think>x", "Hello</think>x"),
    ("<tool_call>f</tool_call>", "<tool_call>f</tool_call>"),
    ("  </think>kept when not at the very start", "  </think>kept when not at the very start"),
])
def test_thinking_off_is_all_content(output, content):
    assert split([output], thinking=False) == ("", content)
    assert split(list(output), thinking=False) == ("", content)


def test_tool_call_stays_in_reasoning_when_calls_are_not_parsed():
    output = "plan<tool_call>f</tool_call></think>after"
    assert split([output], end_reasoning_at_tool_call=False) == ("plan<tool_call>f</tool_call>", "after")


def test_partial_end_tag_is_held_until_decided():
    parser = Glm47ReasoningParser()
    assert parser.feed("step one</thi") == ReasoningDelta("step one", "")
    assert parser.feed("nk>ans") == ReasoningDelta("", "ans")
    assert parser.feed("wer") == ReasoningDelta("", "wer")
    assert parser.finish() == ReasoningDelta("", "")


def test_partial_tag_that_is_not_a_tag_is_released():
    parser = Glm47ReasoningParser()
    assert parser.feed("a </th") == ReasoningDelta("a ", "")
    assert parser.feed("e b") == ReasoningDelta("</the b", "")


def test_finish_flushes_held_tail():
    parser = Glm47ReasoningParser()
    assert parser.feed("truncated </think") == ReasoningDelta("truncated ", "")
    assert parser.finish() == ReasoningDelta("</think", "")


def test_leading_think_split_across_chunks():
    parser = Glm47ReasoningParser()
    assert parser.feed("<th") == ReasoningDelta()
    assert parser.feed("ink>idea") == ReasoningDelta("idea", "")


def test_use_after_finish_is_an_error():
    parser = Glm47ReasoningParser()
    parser.finish()
    with pytest.raises(RuntimeError, match="after finish"):
        parser.feed("x")


EDGE_CASES = [
    "<think>a</think>b", "</think>", "x</thi", "a<tool_call>b</think>c", "<<think>>", "</</think>>",
    "</think></think>", "<think></think><think>", "a</t</th</thi</think>b<tool_call>",
]


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("output", EDGE_CASES)
def test_every_split_gives_the_same_result(output, thinking):
    whole = split([output], thinking)
    for cut in range(len(output) + 1):
        assert split([output[:cut], output[cut:]], thinking) == whole
    rng = random.Random(output)
    for _ in range(20):
        chunks, rest = [], output
        while rest:
            size = rng.randint(1, 5)
            chunks.append(rest[:size])
            rest = rest[size:]
        assert split(chunks, thinking) == whole
