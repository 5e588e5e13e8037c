"""OpenAI-style chat requests -> GLM-4.7 prompts, against prompts written out by hand; tool_choice
semantics; every validation error names its field."""

import json
import re

import pytest

from flint_backend.chat.chat_options import ANNOUNCED_OPTIONS, ChatOptions
from flint_backend.chat.output_parser import ChatOutputParser, parse_chat_output
from flint_backend.chat.request import RenderedPrompt, encode_text_input, load_json_field, render_chat_request
from flint_backend.chat.request_error import ChatRequestError
from flint_backend.chat.tool_choice import unmet_tool_choice
from flint_backend.chat.tool_parser import ToolCall
from flint_backend.tokenizer import load_tokenizer

AUTO = ChatOptions(enable_auto_tool_choice=True, tool_call_parser="glm47", reasoning_parser="glm47")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def render(tok, messages, options=AUTO, **request) -> RenderedPrompt:
    prompt = render_chat_request(tok, messages, options=options, **request)
    assert prompt.prompt_ids == tok(prompt.prompt_text, add_special_tokens=False).input_ids
    assert tok.decode(prompt.prompt_ids) == prompt.prompt_text
    return prompt


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city, e.g. 東京.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {"type": "function", "function": {"name": "search", "description": "Search the web.",
                                                "parameters": {"type": "object"}}}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]

TOOLS_BLOCK = (
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city, e.g. 東京.", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, '
    '"required": ["city"]}}}\n'
    '{"type": "function", "function": {"name": "search", "description": "Search the web.", '
    '"parameters": {"type": "object"}}}\n'
    "</tools>\n\nFor each function call, output the function name and arguments within the following XML format:\n"
    "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
    "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>"
)
ASK = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Weather in 東京?"}]
ASK_PROMPT = "<|system|>You are a helpful assistant.<|user|>Weather in 東京?<|assistant|><think>"


def test_plain_chat(tok):
    prompt = render(tok, ASK)
    assert prompt == RenderedPrompt("[gMASK]<sop>" + ASK_PROMPT, prompt.prompt_ids, True, None, "none")


def test_tools_listed_first_then_the_system_message(tok):
    prompt = render(tok, ASK, tools=TOOLS)
    assert prompt.prompt_text == "[gMASK]<sop>" + TOOLS_BLOCK + ASK_PROMPT
    assert (prompt.tools_for_parser, prompt.tool_choice) == (TOOLS, "auto")


def test_tool_calls_with_json_string_arguments_and_results(tok):
    messages = [
        {"role": "user", "content": "Weather in Paris and 東京?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Two cities, so two calls.",
            "tool_calls": [
                {"id": "call_0", "type": "function", "function": {
                    "name": "get_weather",
                    "arguments": '{"city": "Paris", "days": 3, "options": {"unit": "°C", "hourly": false}}'}},
                {"id": "call_1", "type": "function", "function": {
                    "name": "get_weather", "arguments": '{"city": "\\u6771\\u4eac", "days": 1}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": "18°C, cloudy"},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": '{"temp": 23, "sky": "晴れ"}'}]},
    ]
    assert render(tok, messages, tools=TOOLS).prompt_text == (
        "[gMASK]<sop>" + TOOLS_BLOCK
        + "<|user|>Weather in Paris and 東京?"
        "<|assistant|><think>Two cities, so two calls.</think>"
        "<tool_call>get_weather"
        "<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>days</arg_key><arg_value>3</arg_value>"
        '<arg_key>options</arg_key><arg_value>{"unit": "°C", "hourly": false}</arg_value>'
        "</tool_call>"
        "<tool_call>get_weather"
        "<arg_key>city</arg_key><arg_value>東京</arg_value>"
        "<arg_key>days</arg_key><arg_value>1</arg_value>"
        "</tool_call>"
        "<|observation|>"
        "<tool_response>18°C, cloudy</tool_response>"
        '<tool_response>{"temp": 23, "sky": "晴れ"}</tool_response>'
        "<|assistant|><think>"
    )


def test_thinking_off(tok):
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ]
    prompt = render(tok, messages, chat_template_kwargs={"enable_thinking": False})
    assert prompt.prompt_text == (
        "[gMASK]<sop><|user|>Hi<|assistant|></think>Hello! How can I help?"
        "<|user|>Tell me a joke.<|assistant|></think>"
    )
    assert prompt.thinking is False
    assert render(tok, messages, chat_template_kwargs={"enable_thinking": True}).thinking is True


MULTI_TURN = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "reasoning": "Add them.", "content": "4"},  # the newer field name
    {"role": "user", "content": "And the weather in Paris?"},
    {
        "role": "assistant",
        "content": "<think>\nI need the weather tool.\n</think>\n\nLet me check.",
        "tool_calls": [{"id": "c1", "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "18°C"},
]


def test_interleaved_thinking(tok):
    assert render(tok, MULTI_TURN).prompt_text == (
        "[gMASK]<sop>"
        "<|user|>What is 2+2?"
        "<|assistant|></think>4"
        "<|user|>And the weather in Paris?"
        "<|assistant|><think>I need the weather tool.</think>Let me check."
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
        "<|observation|><tool_response>18°C</tool_response>"
        "<|assistant|><think>"
    )


def test_clear_thinking_false_keeps_all_reasoning(tok):
    prompt = render(tok, MULTI_TURN[:2] + [{"role": "user", "content": "Sure?"}],
                    chat_template_kwargs={"clear_thinking": False})
    assert prompt.prompt_text == (
        "[gMASK]<sop><|user|>What is 2+2?<|assistant|><think>Add them.</think>4<|user|>Sure?<|assistant|><think>"
    )


def test_content_as_text_parts_and_developer_role(tok):
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "name": "ann", "content": [{"type": "text", "text": "Describe "},
                                                    {"type": "text", "text": "this."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "  A cat.  "}]},
    ]
    assert render(tok, messages).prompt_text == (
        "[gMASK]<sop><|system|>Be brief.<|user|>Describe this.<|assistant|></think>A cat.<|assistant|><think>"
    )


def test_calls_without_arguments(tok):
    messages = [
        {"role": "user", "content": "Search twice."},
        {"role": "assistant", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "search", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "search", "arguments": ""}},
        ]},
    ]
    assert render(tok, messages, tools=TOOLS).prompt_text.endswith(
        "<|user|>Search twice.<|assistant|></think><tool_call>search</tool_call><tool_call>search</tool_call>"
        "<|assistant|><think>"
    )


# --- tool_choice ---------------------------------------------------------------------------


def test_tool_choice_none_keeps_tools_in_the_prompt(tok):
    prompt = render(tok, ASK, tools=TOOLS, tool_choice="none")
    assert prompt.prompt_text == "[gMASK]<sop>" + TOOLS_BLOCK + ASK_PROMPT
    assert (prompt.tools_for_parser, prompt.tool_choice) == (None, "none")


def test_tool_choice_none_with_exclude_flag_leaves_tools_out(tok):
    prompt = render(tok, ASK, ANNOUNCED_OPTIONS, tools=TOOLS, tool_choice="none")
    assert prompt.prompt_text == "[gMASK]<sop>" + ASK_PROMPT
    assert (prompt.tools_for_parser, prompt.tool_choice) == (None, "none")
    # the flag matters only for "none"
    assert render(tok, ASK, ANNOUNCED_OPTIONS, tools=TOOLS).prompt_text == "[gMASK]<sop>" + TOOLS_BLOCK + ASK_PROMPT


def test_null_description_and_parameters_count_as_absent(tok):
    bare = {"type": "function", "function": {"name": "ping", "description": None, "parameters": None}}
    assert render(tok, ASK, tools=[bare]).tools_for_parser == [bare]


# JSON Schemas as clients write them (OpenAI and vLLM take these): every one is accepted, and the
# tool-call parser reads each without error.
ACCEPTED_SCHEMAS = [
    {}, {"type": "object"}, {"type": "object", "properties": {}},
    {"type": "object", "properties": {"q": {}, "on": True, "off": False, "ref": {"$ref": "#/$defs/q"}},
     "$defs": {"q": {"type": "string"}}, "required": ["q"], "additionalProperties": False},
    {"type": ["object", "null"], "properties": {"n": {"type": ["integer", "null"], "minimum": 0}}},
    {"type": "object", "properties": None, "anyOf": None, "enum": None},  # null keywords count as absent
    {"properties": {"maybe": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                    "one": {"oneOf": [{"const": 1}, {"enum": ["a", None]}]}, "all": {"allOf": [{"type": "number"}]},
                    "list": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
                    "pair": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}]},
                    "x-extension": {"type": "string", "format": "date", "x-unknown-keyword": 5}}},
]


@pytest.mark.parametrize("parameters", ACCEPTED_SCHEMAS)
def test_json_schemas_clients_send_are_accepted_and_parsed(tok, parameters):
    prompt = render(tok, ASK, tools=[tool_with(parameters)])
    parser = ChatOutputParser(prompt.thinking, prompt.tools_for_parser, prompt.tool_choice,
                              reasoning_parser="glm47", tool_call_parser="glm47")
    parser.feed("</think><tool_call>f<arg_key>n</arg_key><arg_value>3</arg_value></tool_call>")
    parser.finish()
    assert [c.name for c in parser.result().tool_calls] == ["f"]


def test_tool_choice_none_works_without_auto_tool_choice(tok):
    prompt = render(tok, ASK, ChatOptions(), tools=TOOLS, tool_choice="none")
    assert prompt.prompt_text == "[gMASK]<sop>" + TOOLS_BLOCK + ASK_PROMPT


@pytest.mark.parametrize("tool_choice", [None, "auto"])
def test_auto_needs_enable_auto_tool_choice(tok, tool_choice):
    options = ChatOptions(tool_call_parser="glm47", reasoning_parser="glm47")
    with pytest.raises(ChatRequestError, match=r'^tool_choice: .*--enable-auto-tool-choice.*got "auto"') as error:
        render_chat_request(tok, ASK, tools=TOOLS, tool_choice=tool_choice, options=options)
    assert error.value.field == "tool_choice"
    # "required" and named choices parse calls with a tool-call parser alone
    assert render(tok, ASK, options, tools=TOOLS, tool_choice="required").tool_choice == "required"


def test_required_and_named_need_a_tool_call_parser(tok):
    with pytest.raises(ChatRequestError, match=r"tool_choice: .*without --tool-call-parser.*got string \"required\""):
        render_chat_request(tok, ASK, tools=TOOLS, tool_choice="required", options=ChatOptions())


def test_named_tool_choice_parses_only_that_tool(tok):
    named = {"type": "function", "function": {"name": "search"}}
    prompt = render(tok, ASK, tools=TOOLS, tool_choice=named)
    assert prompt.prompt_text == "[gMASK]<sop>" + TOOLS_BLOCK + ASK_PROMPT  # every tool is still listed
    assert (prompt.tools_for_parser, prompt.tool_choice) == (TOOLS, named)
    output = ("Hmm.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
              "<tool_call>search<arg_key>q</arg_key><arg_value>cats</arg_value></tool_call>")
    result = parse_chat_output(output, prompt.thinking, prompt.tools_for_parser, prompt.tool_choice)
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("search", '{"q": "cats"}')]
    assert result.content.startswith("<tool_call>get_weather")


def test_unmet_tool_choice_is_reported():
    named = {"type": "function", "function": {"name": "search"}}
    assert unmet_tool_choice("required", False) == 'tool_choice "required": the model answered without a tool call'
    assert unmet_tool_choice(named, False) == "tool_choice search: the model answered without calling it"
    assert unmet_tool_choice("required", True) is None
    assert unmet_tool_choice("auto", False) is None
    assert unmet_tool_choice("none", False) is None


def test_parser_names():
    assert ChatOptions(tool_call_parser="glm45", reasoning_parser="glm45").tool_call_parser == "glm47"
    with pytest.raises(ValueError, match=r"--tool-call-parser: expected one of glm47, glm45 \(or unset\), got 'hermes'"):
        ChatOptions(tool_call_parser="hermes")
    with pytest.raises(ValueError, match=r"--reasoning-parser: expected one of glm47, glm45"):
        ChatOptions(reasoning_parser="deepseek_r1")
    with pytest.raises(ValueError, match=r"--enable-auto-tool-choice: expected --tool-call-parser"):
        ChatOptions(enable_auto_tool_choice=True)


def test_options_sent_with_a_request_round_trip_and_name_the_bad_key():
    assert ChatOptions.from_request(ANNOUNCED_OPTIONS.to_dict()) == ANNOUNCED_OPTIONS
    assert ChatOptions.from_request({"tool_call_parser": "glm45"}) == ChatOptions(tool_call_parser="glm47")
    for data, field in [([1], "chat_options"), ({"auto": True}, "chat_options.auto"),
                        ({"tool_call_parser": "hermes"}, "chat_options.tool_call_parser"),
                        ({"exclude_tools_when_tool_choice_none": "yes"}, "chat_options.exclude_tools_when_tool_choice_none"),
                        ({"enable_auto_tool_choice": True}, "chat_options.enable_auto_tool_choice")]:
        with pytest.raises(ChatRequestError, match="^" + re.escape(field) + ": expected"):
            ChatOptions.from_request(data)


# --- raw prompts and JSON fields -----------------------------------------------------------


def test_text_input_is_encoded_without_template(tok):
    assert encode_text_input(tok, "Hello 東京") == tok("Hello 東京", add_special_tokens=False).input_ids
    assert encode_text_input(tok, "<|user|>hi")[0] == 8179  # tags written by hand stay tags
    for bad in ["", None, ["a"]]:
        with pytest.raises(ChatRequestError, match=r"^text_input: expected a non-empty string"):
            encode_text_input(tok, bad)


def test_json_fields():
    assert load_json_field("messages", b'[{"role": "user", "content": "hi"}]') == [{"role": "user", "content": "hi"}]
    assert load_json_field("tool_choice", '"auto"') == "auto"
    assert load_json_field("tool_choice", "required") == "required"
    assert load_json_field("tools", "") is None and load_json_field("tools", None) is None
    with pytest.raises(ChatRequestError, match=r"^tools: expected JSON text, got invalid JSON"):
        load_json_field("tools", "[{")


# --- validation ----------------------------------------------------------------------------

USER = {"role": "user", "content": "hi"}


def call(arguments, name="search"):
    return {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                 "function": {"name": name, "arguments": arguments}}]}


def tool_with(parameters):
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


ERRORS = [
    # (request, message pattern)
    ({"messages": []}, r"^messages: expected a non-empty array of messages, got array \[\]"),
    ({"messages": {"role": "user"}}, r"^messages: expected a non-empty array"),
    ({"messages": ["hi"]}, r'^messages\[0\]: expected an object with a role, got string "hi"'),
    ({"messages": [{"role": "bot", "content": "x"}]},
     r'^messages\[0\]\.role: expected one of system, developer, user, assistant, tool, got string "bot"'),
    ({"messages": [{"content": "x"}]}, r"^messages\[0\]\.role: expected one of .*, got null"),
    ({"messages": [{"role": "user"}]}, r"^messages\[0\]\.content: expected a string or an array .*, got null"),
    ({"messages": [{"role": "system", "content": 3}]}, r"^messages\[0\]\.content: expected .*, got 3"),
    ({"messages": [USER, {"role": "assistant"}]},
     r"^messages\[1\]\.content: expected a string or text parts \(or tool_calls\), got null"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     r'^messages\[0\]\.content\[0\]\.type: expected "text" \(Flint reads text only\), got string "image_url"'),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]},
     r"^messages\[0\]\.content\[0\]\.text: expected a string, got null"),
    ({"messages": [{"role": "user", "content": ["hi"]}]}, r"^messages\[0\]\.content\[0\]: expected a"),
    ({"messages": [USER, {"role": "tool", "content": "18°C"}]},
     r"^messages\[1\]\.tool_call_id: expected the id of the tool call this result answers \(a string\), got null"),
    ({"messages": [USER, {"role": "assistant", "tool_calls": {"name": "x"}}]},
     r"^messages\[1\]\.tool_calls: expected an array of tool calls"),
    ({"messages": [USER, {"role": "assistant", "tool_calls": [{"type": "function", "function": {"arguments": "{}"}}]}]},
     r"^messages\[1\]\.tool_calls\[0\]\.function\.name: expected a non-empty string, got null"),
    ({"messages": [USER, {"role": "assistant", "tool_calls": [{"type": "function"}]}]},
     r"^messages\[1\]\.tool_calls\[0\]\.function: expected an object"),
    ({"messages": [USER, {"role": "assistant", "tool_calls": [{"type": "custom", "function": {"name": "x"}}]}]},
     r'^messages\[1\]\.tool_calls\[0\]\.type: expected "function", got string "custom"'),
    ({"messages": [USER, call('{"q": ')]},
     r"^messages\[1\]\.tool_calls\[0\]\.function\.arguments: expected the JSON text of an object, got invalid JSON"),
    ({"messages": [USER, call('["cats"]')]},
     r"^messages\[1\]\.tool_calls\[0\]\.function\.arguments: expected the JSON text of an object, "
     r'got JSON array \["cats"\]'),
    ({"messages": [USER, call('"cats"')]},
     r'^messages\[1\]\.tool_calls\[0\]\.function\.arguments: expected .*, got JSON string "cats"'),
    ({"messages": [USER, call(None)]}, r"^messages\[1\]\.tool_calls\[0\]\.function\.arguments: expected .*, got null"),
    ({"messages": [USER, {"role": "assistant", "content": "x", "reasoning_content": 1}]},
     r"^messages\[1\]\.reasoning_content: expected a string or null, got 1"),
    ({"messages": [USER], "tools": {"type": "function"}}, r"^tools: expected an array of function tools"),
    ({"messages": [USER], "tools": [{"name": "search"}]}, r'^tools\[0\]\.type: expected "function", got null'),
    ({"messages": [USER], "tools": [{"type": "function"}]}, r"^tools\[0\]\.function: expected an object"),
    ({"messages": [USER], "tools": [{"type": "function", "function": {"name": "get weather"}}]},
     r'^tools\[0\]\.function\.name: expected 1 to 64 of a-z, A-Z, 0-9, _ and -, got string "get weather"'),
    ({"messages": [USER], "tools": [{"type": "function", "function": {"name": "x" * 65}}]},
     r"^tools\[0\]\.function\.name: expected 1 to 64"),
    ({"messages": [USER], "tools": [{"type": "function", "function": {"name": "f", "description": 1}}]},
     r"^tools\[0\]\.function\.description: expected a string, got 1"),
    ({"messages": [USER], "tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
     r'^tools\[0\]\.function\.parameters: expected a JSON Schema object, got string "{}"'),
    ({"messages": [USER], "tools": [tool_with({"type": "banana", "properties": 5})]},
     r"^tools\[0\]\.function\.parameters\.type: expected one of string, integer, number, boolean, null, object, "
     r'array \(or a non-empty array of them\), got string "banana"'),
    ({"messages": [USER], "tools": [tool_with({"type": "object", "properties": 5})]},
     r"^tools\[0\]\.function\.parameters\.properties: expected an object of property schemas, got 5"),
    ({"messages": [USER], "tools": [tool_with({"properties": ["city"]})]},
     r'^tools\[0\]\.function\.parameters\.properties: expected an object of property schemas, got array \["city"\]'),
    ({"messages": [USER], "tools": [tool_with({"properties": {"city": "string"}})]},
     r"^tools\[0\]\.function\.parameters\.properties\.city: expected a JSON Schema \(an object or true/false\), "
     r'got string "string"'),
    ({"messages": [USER], "tools": [tool_with({"properties": {"n": {"type": ["integer", "int"]}}})]},
     r"^tools\[0\]\.function\.parameters\.properties\.n\.type: expected one of .*, got array"),
    ({"messages": [USER], "tools": [tool_with({"properties": {"n": {"type": []}}})]},
     r"^tools\[0\]\.function\.parameters\.properties\.n\.type: expected one of .*, got array \[\]"),
    ({"messages": [USER], "tools": [tool_with({"properties": {"n": {"anyOf": 5}}})]},
     r"^tools\[0\]\.function\.parameters\.properties\.n\.anyOf: expected a non-empty array of schemas, got 5"),
    ({"messages": [USER], "tools": [tool_with({"properties": {"n": {"oneOf": [{"type": "integer"}, 3]}}})]},
     r"^tools\[0\]\.function\.parameters\.properties\.n\.oneOf\[1\]: expected a JSON Schema .*, got 3"),
    ({"messages": [USER], "tools": [tool_with({"properties": {"n": {"enum": "abc"}}})]},
     r'^tools\[0\]\.function\.parameters\.properties\.n\.enum: expected an array of values, got string "abc"'),
    ({"messages": [USER], "tools": [tool_with({"properties": {"l": {"items": {"type": "list"}}}})]},
     r"^tools\[0\]\.function\.parameters\.properties\.l\.items\.type: expected one of"),
    ({"messages": [USER], "tools": [SEARCH_TOOL, WEATHER_TOOL, SEARCH_TOOL]},
     r'^tools\[2\]\.function\.name: expected a name no other tool has \(tools\[0\] has it\), got string "search"'),
    ({"messages": [USER], "tools": TOOLS, "chat_template_kwargs": "thinking"},
     r'^chat_template_kwargs: expected an object, got string "thinking"'),
    ({"messages": [USER], "chat_template_kwargs": {"thinking": True}},
     r"^chat_template_kwargs\.thinking: expected only enable_thinking and clear_thinking, got true"),
    ({"messages": [USER], "chat_template_kwargs": {"enable_thinking": "no"}},
     r'^chat_template_kwargs\.enable_thinking: expected true or false, got string "no"'),
    ({"messages": [USER], "tools": TOOLS, "tool_choice": "any"},
     r'^tool_choice: expected "none", "auto", "required" or \{"type": "function", .*, got string "any"'),
    ({"messages": [USER], "tools": TOOLS, "tool_choice": ["auto"]}, r"^tool_choice: expected .*, got array"),
    ({"messages": [USER], "tools": TOOLS, "tool_choice": {"type": "allowed_tools"}},
     r'^tool_choice\.type: expected "function", got string "allowed_tools"'),
    ({"messages": [USER], "tools": TOOLS, "tool_choice": {"type": "function", "function": {}}},
     r"^tool_choice\.function\.name: expected the name of one of the request's tools, got null"),
    ({"messages": [USER], "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "fetch"}}},
     r"^tool_choice\.function\.name: expected one of the request's tools \(get_weather, search\), "
     r'got string "fetch"'),
    ({"messages": [USER], "tool_choice": "auto"},
     r'^tool_choice: expected no tool_choice when the request has no tools, got string "auto"'),
    ({"messages": [USER], "tools": [], "tool_choice": "required"}, r"^tool_choice: expected no tool_choice"),
]


@pytest.mark.parametrize("request_fields, message", ERRORS, ids=[m[1:40] for _, m in ERRORS])
def test_validation_error_names_the_field(tok, request_fields, message):
    request = dict(request_fields)
    with pytest.raises(ChatRequestError, match=message) as error:
        render_chat_request(tok, request.pop("messages"), options=AUTO, **request)
    assert str(error.value).startswith(error.value.field + ": expected ")
    assert isinstance(error.value, ValueError)


def test_long_values_are_shortened_in_messages(tok):
    with pytest.raises(ChatRequestError) as error:
        render_chat_request(tok, [USER, call(json.dumps(["x" * 500]))], options=AUTO)
    assert len(str(error.value)) < 250 and str(error.value).endswith("…")
