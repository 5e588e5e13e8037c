"""The OpenAI server's command line (vLLM's spelling of the chat flags, as in the announcement).

The chat flags are this server's: they go to Triton with every chat request as the
ensemble's `chat_options` input, which replaces the repository's flags for that request,
so what a client of this server gets depends on these flags only (and one Triton server
can front several OpenAI servers with different flags).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from flint_backend.chat.chat_options import ChatOptions

API_KEY_ENV = "FLINT_API_KEY"
TRITON_METRICS_PORT = 8002


@dataclass(frozen=True)
class ServerArgs:
    triton_url: str = "localhost:8001"       # Triton's gRPC endpoint
    model: str = "flint"                     # the ensemble's name in the repository
    served_model_names: tuple[str, ...] = ()  # names clients send as `model`; the first is listed
    chat: ChatOptions = field(default_factory=ChatOptions)
    host: str = "127.0.0.1"
    port: int = 9000
    api_key: str | None = None
    triton_metrics_url: str | None = None    # None: http://<triton host>:8002/metrics
    log_level: str = "info"

    @property
    def model_names(self) -> tuple[str, ...]:
        return self.served_model_names or (self.model,)

    @property
    def metrics_url(self) -> str:
        if self.triton_metrics_url:
            return self.triton_metrics_url
        host = urlsplit("//" + self.triton_url).hostname or "localhost"
        return f"http://{host}:{TRITON_METRICS_PORT}/metrics"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m flint_backend.openai", allow_abbrev=False,
                                     description="OpenAI-compatible server over the flint Triton ensemble")
    parser.add_argument("--triton-url", default="localhost:8001", help="Triton's gRPC address (host:port)")
    parser.add_argument("--model", default="flint", help="the Triton ensemble to call")
    parser.add_argument("--served-model-name", nargs="+", default=[],
                        help="model name(s) clients use (default: --model); the first is listed by /v1/models")
    parser.add_argument("--enable-auto-tool-choice", action="store_true")
    parser.add_argument("--tool-call-parser", default=None)
    parser.add_argument("--reasoning-parser", default=None)
    parser.add_argument("--exclude-tools-when-tool-choice-none", action="store_true")
    parser.add_argument("--no-constrain-auto-tool-calls", dest="constrain_auto_tool_calls", action="store_false",
                        help='leave tool_choice "auto" calls free (by default held to a listed tool and its schema)')
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                        help=f"clients must send `Authorization: Bearer KEY` (default: ${API_KEY_ENV}; none: open)")
    parser.add_argument("--triton-metrics-url", default=None,
                        help=f"Triton's metrics (default http://<triton host>:{TRITON_METRICS_PORT}/metrics)")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return parser


def parse_args(argv: list[str] | None = None) -> ServerArgs:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        chat = ChatOptions(args.enable_auto_tool_choice, args.tool_call_parser, args.reasoning_parser,
                           args.exclude_tools_when_tool_choice_none, args.constrain_auto_tool_calls)
    except ValueError as error:
        parser.error(str(error))
    if not 0 < args.port < 65536:
        parser.error(f"--port: expected 1..65535, got {args.port}")
    return ServerArgs(triton_url=args.triton_url, model=args.model, served_model_names=tuple(args.served_model_name),
                      chat=chat, host=args.host, port=args.port, api_key=args.api_key or None,
                      triton_metrics_url=args.triton_metrics_url, log_level=args.log_level)
