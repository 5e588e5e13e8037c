"""An OpenAI-compatible HTTP server in front of the `flint` Triton ensemble.

    python -m flint_backend.openai --triton-url localhost:8001 --model flint \\
        --enable-auto-tool-choice --tool-call-parser glm47 --reasoning-parser glm47 \\
        --exclude-tools-when-tool-choice-none [--port 9000] [--api-key KEY]

It talks to Triton only (tritonclient's asyncio gRPC streaming, one stream per HTTP
request), never to the engine. `server_args` (flags), `protocol` (request bodies),
`triton` (the ensemble's tensors), `chat` and `completions` (the two endpoints' answers),
`errors` (OpenAI's error shape), `metrics`, `gate` (API key, counts), `disconnect`
(cancelling Triton requests of clients that left), `app` (the routes).
"""
