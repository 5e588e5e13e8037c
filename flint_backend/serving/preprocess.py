"""The flint_tokenizer step: a request's tensors -> prompt ids, the engine's sampling
parameters, and what the postprocessor needs to turn tokens back into the answer.

A raw `text_input` prompt is encoded as is (no template) and its output is plain text; so is
a prompt given as token ids (`input_ids`), echoed as their decoded text.
A chat request (`messages`, `tools`, ...) is rendered with the GLM-4.7 template and its
output goes through the reasoning and tool-call parsers the server runs with (the
repository's flags, or the request's `chat_options`). The prompt
is echoed in front of the output only for raw prompts (text or ids) with exclude_input_in_output=false.
"""

from __future__ import annotations

from dataclasses import dataclass

from flint_backend.chat.chat_options import ChatOptions
from flint_backend.chat.request import encode_text_input, render_chat_request
from flint_backend.chat.request_error import ChatRequestError
from flint_backend.serving.chunks import OutputConfig
from flint_backend.serving.generate_request import GenerateRequest, parse_generate_request, sampling_json
from flint_backend.serving.tensors import Inputs
from flint_backend.serving.tool_constraint import tool_call_tag

REASONING_END = "</think>"  # with thinking on, guided decoding starts after it
PROMPT_TAIL_TOKENS = 5  # prompt ids the detokenizer starts from (chat.detokenizer.PROMPT_CONTEXT_TOKENS)


@dataclass
class Preprocessed:
    prompt_ids: list[int]
    sampling_json: str
    output_config: OutputConfig


class Preprocessor:
    def __init__(self, tokenizer, options: ChatOptions = ChatOptions(), default_max_tokens: int = 16):
        self.tokenizer = tokenizer
        self.options = options
        self.default_max_tokens = default_max_tokens

    def __call__(self, inputs: Inputs) -> Preprocessed:
        """Raises ValueError (ChatRequestError, SamplingParamsError) naming the field."""
        request = parse_generate_request(inputs, self.default_max_tokens)
        config = OutputConfig(stream=request.stream, stop=request.stop,
                              skip_special_tokens=request.skip_special_tokens)
        if request.text_input is not None:
            ids = encode_text_input(self.tokenizer, request.text_input)
            if not request.exclude_input_in_output:
                config.echo = request.text_input
        elif request.input_ids is not None:
            ids = request.input_ids
            if not request.exclude_input_in_output:
                config.echo = self.tokenizer.decode(ids, skip_special_tokens=False)
        else:
            ids = self._render_chat(request, config)
        config.prompt_tail = ids[-PROMPT_TAIL_TOKENS:]
        return Preprocessed(ids, sampling_json(request.sampling), config)

    def _render_chat(self, request: GenerateRequest, config: OutputConfig) -> list[int]:
        c = request.chat
        options = request.chat_options or self.options
        rendered = render_chat_request(self.tokenizer, c.get("messages"), c.get("tools"), c.get("tool_choice"),
                                       c.get("chat_template_kwargs"), options)
        tag = tool_call_tag(rendered.tools_for_parser, rendered.tool_choice, rendered.thinking,
                            options.tool_call_parser, request.parallel_tool_calls, options.constrain_auto_tool_calls)
        if tag is not None and request.sampling.get("guided_json") is not None:
            if rendered.tool_choice != "auto":
                raise ChatRequestError("guided_json", "none with tool_choice \"required\" or a named function "
                                       "(the tool call is the output)", "a schema")
            tag = None  # "auto" with a schema for the content: the schema holds, the calls are free
        if tag is not None:
            request.sampling["structural_tag"] = tag
        elif request.sampling.get("guided_json") is not None and rendered.thinking:  # after the reasoning
            request.sampling["guided_start_token_id"] = self.tokenizer.convert_tokens_to_ids(REASONING_END)
        config.chat = {"thinking": rendered.thinking, "tools": rendered.tools_for_parser,
                       "tool_choice": rendered.tool_choice, "reasoning_parser": options.reasoning_parser,
                       "tool_call_parser": options.tool_call_parser}
        return rendered.prompt_ids
