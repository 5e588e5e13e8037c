"""`python -m flint_backend.openai ...`: see server_args.py for the flags."""

import logging

import uvicorn

from flint_backend.openai.app import build_app
from flint_backend.openai.server_args import parse_args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per /metrics scrape otherwise
    uvicorn.run(build_app(args), host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
