"""What the Triton model repository runs, kept free of Triton so it is tested without a server.

`generate_request` (the `flint` ensemble's inputs -> a request), `preprocess` (the
flint_tokenizer step), `engine_host` (the flint_model step: engine thread + response queue),
`postprocess` (the flint_postprocess step: detokenise, stop strings, parsers), `chunks` (what
passes between the steps: OutputConfig, EngineChunk, TextDelta and their tensors), `metrics`
(engine counters -> Triton custom metrics), `repository` (engine_args.json, tokenizer path),
`configure` (`python -m flint_backend.serving.configure`: a configured copy of model_repository/,
build/model_repository, from vLLM-style flags), `launch` (starts tritonserver: the system's, or
the one in the nvidia-pytriton wheel), `parent_watch` (flint_model's process ends with its
tritonserver and on SIGTERM).
The `model.py` files in model_repository/ only move tensors between Triton and these.
"""
