"""Server-wide chat flags, named as the announcement (and vLLM) spell them:

    --enable-auto-tool-choice --tool-call-parser glm47 --reasoning-parser glm47
    --exclude-tools-when-tool-choice-none

They are the server's configuration, not a request's: a bad value is a ValueError at
start-up, not a ChatRequestError. "glm45" is accepted as another name for the glm47
parsers (vLLM has both; GLM-4.5 puts newlines between the tool-call tags, which the
glm47 tool parser already skips), so a vLLM command line carries over unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def __post_init__(self):
        # frozen: normalise the aliases through object.__setattr__
        object.__setattr__(self, "tool_call_parser", _parser_name("--tool-call-parser", self.tool_call_parser))
        object.__setattr__(self, "reasoning_parser", _parser_name("--reasoning-parser", self.reasoning_parser))
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice: expected --tool-call-parser to be set too, got none")


# The announcement's command line.
ANNOUNCED_OPTIONS = ChatOptions(enable_auto_tool_choice=True, tool_call_parser="glm47",
                                reasoning_parser="glm47", exclude_tools_when_tool_choice_none=True)
