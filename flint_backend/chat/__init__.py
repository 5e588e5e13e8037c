"""Chat text handling around the model (pure text, no GPU).

Request side: `request` (OpenAI messages/tools/tool_choice -> GLM-4.7 prompt ids, raw prompts),
`messages`, `tool_choice`, `chat_options` (server flags), `request_error` (ChatRequestError).
Output side: `detokenizer` (ids -> text deltas), `stop_strings`, `output_parser` (glm47
reasoning split, then `tool_parser` on the content).
"""
