"""Server-wide chat flags, named as the announcement (and vLLM) spell them:

    --enable-auto-tool-choice --tool-call-parser glm47 --reasoning-parser glm47
    --exclude-tools-when-tool-choice-none [--no-constrain-auto-tool-calls]

They are the server's configuration: a bad flag is a ValueError at start-up. A front end
with flags of its own (the OpenAI server) sends them with each request as the JSON
`chat_options` (`ChatOptions.from_request`), which then replaces the repository's
flags for that request; a bad value there is a ChatRequestError. "glm45" is accepted as another name for the glm47
parsers (vLLM has both; GLM-4.5 puts newlines between the tool-call tags, which the
glm47 tool parser already skips), so a vLLM command line carries over unchanged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from flint_backend.chat.request_error import ChatRequestError, describe

PARSER_ALIASES = {"glm47": "glm47", "glm45": "glm47"}


def _parser_name(flag: str, name: str | None) -> str | None:
    if name is None or name in PARSER_ALIASES:
        return PARSER_ALIASES.get(name)
    raise ValueError(f"{flag}: expected one of {', '.join(PARSER_ALIASES)} (or unset), got {name!r}")


@dataclass(frozen=True)
class ChatOptions:
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    exclude_tools_when_tool_choice_none: bool = False
    constrain_auto_tool_calls: bool = True  # "auto" calls held to a listed tool and its schema (--no-...: free)

    def __post_init__(self):
        # frozen: normalise the aliases through object.__setattr__
        object.__setattr__(self, "tool_call_parser", _parser_name("--tool-call-parser", self.tool_call_parser))
        object.__setattr__(self, "reasoning_parser", _parser_name("--reasoning-parser", self.reasoning_parser))
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice: expected --tool-call-parser to be set too, got none")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_request(cls, data: object, field: str = "chat_options") -> "ChatOptions":
        """`{"enable_auto_tool_choice": bool, "tool_call_parser": str|null, ...}`; keys left out
        take the defaults."""
        if not isinstance(data, dict):
            raise ChatRequestError(field, "an object of chat flags", describe(data))
        known = {f.name: f for f in fields(cls)}
        for key, value in data.items():
            if key not in known:
                raise ChatRequestError(f"{field}.{key}", "one of " + ", ".join(known), describe(value))
            is_flag = known[key].type == "bool"
            if (is_flag and not isinstance(value, bool)) or (not is_flag and value is not None
                                                              and value not in PARSER_ALIASES):
                expected = "true or false" if is_flag else "null or one of " + ", ".join(PARSER_ALIASES)
                raise ChatRequestError(f"{field}.{key}", expected, describe(value))
        try:
            return cls(**data)
        except ValueError as error:  # auto tool choice without a tool-call parser
            raise ChatRequestError(f"{field}.enable_auto_tool_choice", "tool_call_parser to be set too",
                                   describe(data.get("tool_call_parser"))) from error


# The announcement's command line.
ANNOUNCED_OPTIONS = ChatOptions(enable_auto_tool_choice=True, tool_call_parser="glm47",
                                reasoning_parser="glm47", exclude_tools_when_tool_choice_none=True)
