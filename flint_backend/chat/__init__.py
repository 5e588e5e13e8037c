"""Chat text handling around the model: GLM-4.7 reasoning and tool-call parsers (pure text, no GPU)."""
