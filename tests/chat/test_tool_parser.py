import itertools
import json
import random
import re

import pytest

from flint_backend.chat.tool_parser import Glm47ToolParser, ToolCall, ToolCallDelta, ToolDelta


def tool(name, properties):
    return {"type": "function", "function": {
        "name": name, "description": f"{name} tool",
        "parameters": {"type": "object", "properties": properties}}}


TOOLS = [
    tool("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"}}),
    tool("typed", {
        "s": {"type": "string"}, "i": {"type": "integer"}, "f": {"type": "number"},
        "b": {"type": "boolean"}, "n": {"type": "null"}, "o": {"type": "object"},
        "a": {"type": "array", "items": {"type": "integer"}},
        "maybe": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "si": {"type": ["string", "integer"]}, "e": {"enum": [1, 2, 3]}, "anything": {},
    }),
    tool("ping", {}),
]


def counting_ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def parse(chunks, tools=TOOLS):
    """Feed chunks; return (content, calls) from the deltas after checking their order, and the result."""
    parser = Glm47ToolParser(tools, id_factory=counting_ids())
    deltas = [parser.feed(chunk) for chunk in chunks] + [parser.finish()]
    content, headers, arguments = "", [], []
    for delta in deltas:
        content += delta.content
        for call in delta.calls:
            if call.name is not None:  # a header comes first, once, in index order
                assert (call.index, call.type, call.arguments) == (len(headers), "function", "")
                headers.append((call.id, call.name))
                arguments.append("")
            else:
                assert (call.id, call.type) == (None, None) and call.index < len(headers)
                arguments[call.index] += call.arguments
    result = parser.result()
    assert result.content == content
    streamed = [ToolCall(i, n, a) for (i, n), a in zip(headers, arguments)]
    assert streamed[:len(result.calls)] == result.calls
    return content, [(c.name, c.arguments) for c in result.calls], parser


def all_ways(output, tools=TOOLS):
    """The parse of output fed whole, one character at a time and in random chunks; all must agree."""
    whole = parse([output], tools)[:2]
    assert parse(list(output), tools)[:2] == whole
    rng = random.Random(output)
    for _ in range(5):
        cuts = sorted(rng.sample(range(1, len(output)), min(len(output) - 1, rng.randint(1, 8)))) if len(output) > 1 else []
        chunks = [output[a:b] for a, b in zip([0, *cuts], [*cuts, len(output)])]
        assert parse(chunks, tools)[:2] == whole
    return whole


def call(name, *pairs, sep=""):
    body = "".join(f"{sep}<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>" for k, v in pairs)
    return f"<tool_call>{name}{body}{sep}</tool_call>"


def test_name_followed_directly_by_arg_key():
    output = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
    assert all_ways(output) == ("", [("get_weather", '{"city": "Paris"}')])


@pytest.mark.parametrize("output", ["<tool_call>ping</tool_call>", "<tool_call>ping\n</tool_call>",
                                    "<tool_call> ping </tool_call>"])
def test_call_without_arguments(output):
    assert all_ways(output) == ("", [("ping", "{}")])


def test_glm45_whitespace_between_tags():
    output = ("<tool_call>get_weather\n<arg_key>city</arg_key>\n  <arg_value>Paris</arg_value>\n"
              "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>")
    assert all_ways(output) == ("", [("get_weather", '{"city": "Paris", "days": 3}')])


def test_spaces_inside_string_values_are_kept_and_around_them_dropped():
    output = call("get_weather", ("city", "  New  York \n"))
    assert all_ways(output) == ("", [("get_weather", '{"city": "New  York"}')])


def test_string_typed_digits_stay_a_string():
    output = call("get_weather", ("city", "123"), ("days", "123"))
    assert all_ways(output) == ("", [("get_weather", '{"city": "123", "days": 123}')])


def test_values_typed_by_schema():
    output = call("typed", ("i", "-42"), ("f", "2.5"), ("b", "true"), ("n", "null"),
                  ("o", '{"x": [1, {"y": null}], "z": "w"}'), ("a", "[1,2,3]"), ("e", "2"), ("anything", "7"))
    args = '{"i": -42, "f": 2.5, "b": true, "n": null, "o": {"x": [1, {"y": null}], "z": "w"}, "a": [1, 2, 3], "e": 2, "anything": 7}'
    assert all_ways(output) == ("", [("typed", args)])


def test_non_string_values_that_are_not_json_fall_back_to_the_raw_string():
    output = call("typed", ("i", "about 3"), ("b", "True"), ("f", "NaN"), ("o", "{broken"), ("anything", "plain"))
    args = '{"i": "about 3", "b": "True", "f": "NaN", "o": "{broken", "anything": "plain"}'
    assert all_ways(output) == ("", [("typed", args)])


def test_json_values_may_have_surrounding_whitespace():
    output = call("typed", ("i", " 5\n"), ("a", "\n[ 1 ]\n"))
    assert all_ways(output) == ("", [("typed", '{"i": 5, "a": [1]}')])


@pytest.mark.parametrize("raw, encoded", [("null", "null"), ("none", '"none"'), ("123", '"123"'),
                                          (" null ", "null"), ('"quoted"', '"\\"quoted\\""')])
def test_any_of_string_and_null(raw, encoded):
    assert all_ways(call("typed", ("maybe", raw))) == ("", [("typed", f'{{"maybe": {encoded}}}')])


@pytest.mark.parametrize("raw, encoded", [("123", "123"), ("12.5", '"12.5"'), ("abc", '"abc"'), ("null", '"null"')])
def test_type_list_of_string_and_integer(raw, encoded):
    assert all_ways(call("typed", ("si", raw))) == ("", [("typed", f'{{"si": {encoded}}}')])


def test_quotes_backslashes_and_newlines_in_values():
    output = call("typed", ("s", 'say "hi"\\n C:\\path\nline2\t<b>é🙂'), ("o", '{"q": "a\\"b\\\\c\\nd"}'))
    args = '{"s": "say \\"hi\\"\\\\n C:\\\\path\\nline2\\t<b>é🙂", "o": {"q": "a\\"b\\\\c\\nd"}}'
    assert all_ways(output) == ("", [("typed", args)])
    assert json.loads(args) == {"s": 'say "hi"\\n C:\\path\nline2\t<b>é🙂', "o": {"q": 'a"b\\c\nd'}}


def test_two_calls_back_to_back():
    output = call("get_weather", ("city", "Oslo")) + call("ping")
    assert all_ways(output) == ("", [("get_weather", '{"city": "Oslo"}'), ("ping", "{}")])


def test_text_before_between_and_after_calls():
    output = "Checking. " + call("ping") + "\nand\n" + call("get_weather", ("days", "1")) + " Done."
    assert all_ways(output) == ("Checking. \nand\n Done.", [("ping", "{}"), ("get_weather", '{"days": 1}')])


def test_unknown_tool_name_is_content():
    output = "a" + call("launch_rockets", ("when", "now")) + "b" + call("ping")
    assert all_ways(output) == (
        "a<tool_call>launch_rockets<arg_key>when</arg_key><arg_value>now</arg_value></tool_call>b", [("ping", "{}")])
    assert all_ways("<tool_call>nope</tool_call>") == ("<tool_call>nope</tool_call>", [])
    assert all_ways("<tool_call></tool_call>") == ("<tool_call></tool_call>", [])


def test_no_tools_accepts_any_name_with_string_values():
    output = call("anything", ("n", "5"))
    assert all_ways(output, tools=None) == ("", [("anything", '{"n": "5"}')])
    assert all_ways(output, tools=[]) == (output, [])


def test_missing_end_arg_value_ends_at_next_key_or_end_of_call():
    output = ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome"
              "<arg_key>days</arg_key><arg_value>2</tool_call>")
    assert all_ways(output) == ("", [("get_weather", '{"city": "Rome", "days": 2}')])


def test_key_without_value_is_dropped_and_repeated_key_keeps_first_value():
    output = ("<tool_call>get_weather<arg_key>days</arg_key><arg_key>city</arg_key><arg_value>A</arg_value>"
              "<arg_key>city</arg_key><arg_value>B</arg_value><arg_key>days</arg_key></tool_call>")
    assert all_ways(output) == ("", [("get_weather", '{"city": "A"}')])


def test_end_arg_value_split_across_chunks_is_held_back():
    parser = Glm47ToolParser(TOOLS, id_factory=counting_ids())
    assert parser.feed("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Par") == ToolDelta("", [
        ToolCallDelta(0, "call_0", "function", "get_weather"), ToolCallDelta(0, arguments='{"city": "Par')])
    assert parser.feed("is</arg_") == ToolDelta("", [ToolCallDelta(0, arguments="is")])
    assert parser.feed("value></tool") == ToolDelta("", [ToolCallDelta(0, arguments='"')])
    assert parser.feed("_call>") == ToolDelta("", [ToolCallDelta(0, arguments="}")])
    assert parser.finish() == ToolDelta()
    assert parser.result().calls == [ToolCall("call_0", "get_weather", '{"city": "Paris"}')]


def test_tag_like_text_inside_a_value_is_released_when_it_turns_out_not_to_be_a_tag():
    parser = Glm47ToolParser(TOOLS, id_factory=counting_ids())
    parser.feed("<tool_call>get_weather<arg_key>city</arg_key><arg_value>a</arg")
    assert parser.feed("_val b") == ToolDelta("", [ToolCallDelta(0, arguments="</arg_val b")])
    assert all_ways(call("get_weather", ("city", "x </arg_valu <tool_call> </arg <arg_ke"))) == (
        "", [("get_weather", '{"city": "x </arg_valu <tool_call> </arg <arg_ke"}')])


def test_partial_tool_call_tag_is_never_sent_as_content():
    parser = Glm47ToolParser(TOOLS, id_factory=counting_ids())
    assert parser.feed("Let me check <tool_") == ToolDelta("Let me check ")
    assert parser.feed("call>ping</tool_call>") == ToolDelta("", [
        ToolCallDelta(0, "call_0", "function", "ping"), ToolCallDelta(0, arguments="{}")])
    assert parser.feed(" <tool") == ToolDelta(" ")
    assert parser.finish() == ToolDelta("<tool")


def test_typed_values_are_sent_when_complete():
    parser = Glm47ToolParser(TOOLS, id_factory=counting_ids())
    parser.feed("<tool_call>get_weather<arg_key>days</arg_key><arg_value>1")
    assert parser.feed("0") == ToolDelta()
    assert parser.feed("</arg_value>") == ToolDelta("", [ToolCallDelta(0, arguments='"days": 10')])


def test_truncated_call_is_content_but_its_header_was_streamed():
    output = "Sure. <tool_call>get_weather<arg_key>city</arg_key><arg_value>Par"
    parser = Glm47ToolParser(TOOLS, id_factory=counting_ids())
    first = parser.feed(output)
    assert first == ToolDelta("Sure. ", [ToolCallDelta(0, "call_0", "function", "get_weather"),
                                         ToolCallDelta(0, arguments='{"city": "Par')])
    assert parser.finish() == ToolDelta("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Par")
    assert parser.result().content == output and parser.result().calls == []
    assert not parser.has_tool_calls
    assert all_ways(output) == (output, [])
    assert all_ways("<tool_call>get_wea") == ("<tool_call>get_wea", [])


def test_has_tool_calls_after_a_closed_call():
    parser = Glm47ToolParser(TOOLS)
    parser.feed("<tool_call>ping</tool_call>")
    assert parser.has_tool_calls


def test_default_ids():
    parser = Glm47ToolParser(TOOLS)
    parser.feed(call("ping") + call("ping"))
    parser.finish()
    ids = [c.id for c in parser.result().calls]
    assert all(re.fullmatch(r"call_[A-Za-z0-9]{24}", i) for i in ids) and ids[0] != ids[1]


def test_bad_tool_definition_names_the_field():
    with pytest.raises(ValueError, match="tool.function.name"):
        Glm47ToolParser([{"type": "function", "function": {"description": "no name"}}])


EDGE_CASES = [
    call("get_weather", ("city", "</arg_value"), ("days", "7")),
    call("typed", ("s", "<"), ("maybe", "</"), ("o", '{"t": "</tool_call"}')),
    "<tool_call" + call("ping") + "</tool_call>",
    "<<tool_call>ping</tool_call>>",
    "<tool_call>ping<tool_call>ping</tool_call>",
    "<tool_call>get_weather<arg_key> city </arg_key> junk <arg_value>v</arg_value> junk </tool_call>",
    "<tool_call>unknown<arg_key>k</arg_key><arg_value><tool_call>ping</tool_call></arg_value></tool_call>",
    "</tool_call>" + call("get_weather", ("city", "")),
    call("get_weather", ("city", "a</arg_value>b")),
    "<tool_call>get_weather<arg_key>city<arg_value>x</arg_value></tool_call>",
]


@pytest.mark.parametrize("output", EDGE_CASES)
def test_edge_cases_parse_the_same_in_every_chunking(output):
    whole = all_ways(output)
    for cut in range(len(output) + 1):
        assert parse([output[:cut], output[cut:]])[:2] == whole
