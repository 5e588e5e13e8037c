"""The GLM-4.7 chat template (flint_backend/tokenizer/chat_template.jinja), rendered by
transformers' apply_chat_template, against prompts written out by hand."""

import json

import pytest

from flint_backend.tokenizer import TOKENIZER_DIR, load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def render(tok, messages, tools=None, add_generation_prompt=True, **kwargs):
    return tok.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )


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
SEARCH_TOOL = {"name": "search", "description": "Search the web.", "parameters": {"type": "object"}}

# The first <|system|> block when tools are given: one tojson(ensure_ascii=False) per line.
TOOLS_BLOCK = (
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city, e.g. 東京.", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, '
    '"required": ["city"]}}}\n'
    '{"name": "search", "description": "Search the web.", "parameters": {"type": "object"}}\n'
    "</tools>\n\nFor each function call, output the function name and arguments within the following XML format:\n"
    "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
    "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>"
)


def test_plain_chat(tok):
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello!"},
    ]
    # no newline after role tags (4.7); the generation prompt opens the reasoning
    assert render(tok, messages) == (
        "[gMASK]<sop><|system|>You are a helpful assistant.<|user|>Hello!<|assistant|><think>"
    )


def test_system_and_two_tools(tok):
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Weather in 東京?"},
    ]
    # the tools block comes first; the user's system message follows as its own block
    assert render(tok, messages, tools=[WEATHER_TOOL, SEARCH_TOOL]) == (
        "[gMASK]<sop>"
        "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city, e.g. 東京.", '
        '"parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, '
        '"required": ["city"]}}}\n'
        '{"name": "search", "description": "Search the web.", "parameters": {"type": "object"}}\n'
        "</tools>\n\nFor each function call, output the function name and arguments within the following XML format:\n"
        "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
        "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>"
        "<|system|>You are a helpful assistant."
        "<|user|>Weather in 東京?"
        "<|assistant|><think>"
    )


def test_tool_calls_and_results(tok):
    messages = [
        {"role": "user", "content": "Weather in Paris and 東京?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Two cities, so two calls.",
            "tool_calls": [
                {  # OpenAI shape
                    "id": "call_0",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": {"city": "Paris", "days": 3, "options": {"unit": "°C", "hourly": False}},
                    },
                },
                {"name": "get_weather", "arguments": {"city": "東京", "days": 1}},  # flat shape
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": "18°C, cloudy"},
        {"role": "tool", "content": '{"temp": 23, "sky": "晴れ"}'},
    ]
    # string arguments raw, others as JSON; both results share one <|observation|>;
    # the turn is after the last user message, so its reasoning stays
    assert render(tok, messages, tools=[WEATHER_TOOL, SEARCH_TOOL]) == (
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
    assert render(tok, messages, enable_thinking=False) == (
        "[gMASK]<sop><|user|>Hi<|assistant|></think>Hello! How can I help?"
        "<|user|>Tell me a joke.<|assistant|></think>"
    )


MULTI_TURN = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "reasoning_content": "Add them.", "content": "4"},
    {"role": "user", "content": "And the weather in Paris?"},
    {  # reasoning given inside content: split off at </think>
        "role": "assistant",
        "content": "<think>\nI need the weather tool.\n</think>\n\nLet me check.",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    },
    {"role": "tool", "content": "18°C"},
]


def test_interleaved_thinking(tok):
    # the turn before the last user message loses its reasoning (bare </think>);
    # the one after it keeps <think>…</think>
    assert render(tok, MULTI_TURN) == (
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
    assert render(tok, MULTI_TURN[:2], clear_thinking=False, add_generation_prompt=False) == (
        "[gMASK]<sop><|user|>What is 2+2?<|assistant|><think>Add them.</think>4"
    )


def test_content_as_text_parts(tok):
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Describe "},
                {"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}},  # skipped
                {"type": "text", "text": "this."},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "  A cat.  "}]},
        {"role": "tool", "content": [{"type": "text", "text": "ok"}]},
    ]
    assert render(tok, messages) == (
        "[gMASK]<sop><|system|>Be brief.<|user|>Describe this.<|assistant|></think>A cat."
        "<|observation|><tool_response>ok</tool_response><|assistant|><think>"
    )


def test_assistant_without_content(tok):
    messages = [
        {"role": "user", "content": "Search for cats."},
        {"role": "assistant", "content": None, "tool_calls": [{"name": "search", "arguments": {}}]},
    ]
    assert render(tok, messages, add_generation_prompt=False) == (
        "[gMASK]<sop><|user|>Search for cats.<|assistant|></think><tool_call>search</tool_call>"
    )


def test_string_arguments_are_an_error(tok):
    messages = [{"role": "assistant", "tool_calls": [{"name": "search", "arguments": '{"q": "cats"}'}]}]
    with pytest.raises(Exception, match=r"arguments of search: expected a mapping"):
        render(tok, messages)


def test_unknown_role_is_an_error(tok):
    with pytest.raises(Exception, match=r"messages\[0\].role: expected system, user, assistant or tool, got bot"):
        render(tok, [{"role": "bot", "content": "hi"}])


def test_config_embeds_the_jinja_source(tok):
    source = (TOKENIZER_DIR / "chat_template.jinja").read_text(encoding="utf-8")
    config = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["chat_template"] == source
    assert tok.chat_template == source
