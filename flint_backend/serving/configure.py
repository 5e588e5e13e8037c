"""Write a configured model repository from a vLLM-style command line (the announcement's flags).

    python -m flint_backend.serving.configure [MODEL] [--model PATH|ORG/NAME] [--hf-config-path P] [--tokenizer P]
        [--preset flint-40b [--seed S] [--quantization nvfp4]]     (no MODEL: random weights)
        [--enable-auto-tool-choice] [--tool-call-parser glm47] [--reasoning-parser glm47]
        [--exclude-tools-when-tool-choice-none] [--no-constrain-auto-tool-calls] [--default-max-tokens N]
        [--kernel-backend triton] [--device cuda] [--max-num-seqs N] [--max-num-batched-tokens N]
        [--no-enable-prefix-caching] [--response-busy-fraction 0.25] ...
        [--gpus 0,1,...|all] [--instances N] [--repository build/model_repository] [--source model_repository]

The tracked `model_repository/` is the source: its models are copied to `--repository`
(default `build/model_repository`, which git ignores; `make serve` serves it), and the copy's
configuration files are written there, so a checkout stays clean and `model_repository/` stays
the default that `tritonserver --model-repository model_repository` serves as it is.
`--repository` equal to `--source` configures that repository in place (e.g. a copy of your own).

Every EngineArgs field is a flag (`--max-model-len`, `--kv-cache-memory-fraction`, ...; vLLM's
`--gpu-memory-utilization` is another name for the last); they are written, all of them,
to flint_model/1/engine_args.json. A bool field takes true or false (`--async-scheduling false`),
except `enable_prefix_caching`, spelled as vLLM's: `--enable-prefix-caching` (the default) or
`--no-enable-prefix-caching`. The chat flags go to flint_tokenizer/config.pbtxt's
parameters. The result depends on the flags only (anything not given takes its default),
as a server command line does. Unknown flags are errors. MODEL may be a path or a Hugging
Face repo id already in the local cache (a GGUF repo resolves to its .gguf file); a relative
path is stored relative to engine_args.json, so the repository can move with the project.
Without a model the engine builds random weights of `--preset` on its device at load time
(`--seed S`, `--quantization nvfp4` for W4A16): the full-size flint-40b served with nothing on disk.

Scale-out is flint_model's instance_group (config.pbtxt): `--gpus 0,1` runs one engine per
GPU (KIND_GPU; `all`: every GPU this machine shows, e.g. a pod's), `--instances N` runs N CPU
engines (KIND_CPU), or N per GPU with --gpus; neither: one engine on `--device` (KIND_MODEL).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from dataclasses import fields
from pathlib import Path

from flint_backend.chat.chat_options import ChatOptions
from flint_backend.engine.engine_args import EngineArgs
from flint_backend.serving.launch import PROJECT_ROOT
from flint_backend.serving.repository import (ENGINE_MODEL, PATH_KEYS, checked_busy_fraction, engine_args_path,
                                              instance_group, resolve_model_path, set_instance_group)

TOKENIZER_CONFIG = Path("flint_tokenizer") / "config.pbtxt"
ENGINE_CONFIG = Path(ENGINE_MODEL) / "config.pbtxt"
ALIASES = {"gpu_memory_utilization": "kv_cache_memory_fraction"}
SWITCHES = ("enable_prefix_caching",)  # bool engine args spelled --x / --no-x (vLLM's), not --x true|false
CHAT_FLAGS = ("enable_auto_tool_choice", "tool_call_parser", "reasoning_parser",
              "exclude_tools_when_tool_choice_none", "constrain_auto_tool_calls", "default_max_tokens")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m flint_backend.serving.configure", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    parser.add_argument("model_positional", nargs="?", metavar="MODEL", help="same as --model")
    parser.add_argument("--repository", type=Path, default=PROJECT_ROOT / "build" / "model_repository",
                        help="the repository to write (default: build/model_repository)")
    parser.add_argument("--source", type=Path, default=PROJECT_ROOT / "model_repository",
                        help="the repository whose models are copied (default: the tracked model_repository)")
    for f in fields(EngineArgs):
        if f.name in SWITCHES:
            parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, action=argparse.BooleanOptionalAction,
                                default=None, help=f"engine arg {f.name} (default {f.default!r})")
            continue
        flags = ["--" + f.name.replace("_", "-")]
        flags += ["--" + alias.replace("_", "-") for alias, target in ALIASES.items() if target == f.name]
        parser.add_argument(*flags, dest=f.name, type=_converter(str(f.type)), default=None,
                            help=f"engine arg {f.name} (default {f.default!r})")
    parser.add_argument("--enable-auto-tool-choice", action="store_true")
    parser.add_argument("--tool-call-parser", default="")
    parser.add_argument("--reasoning-parser", default="")
    parser.add_argument("--exclude-tools-when-tool-choice-none", action="store_true")
    parser.add_argument("--no-constrain-auto-tool-calls", dest="constrain_auto_tool_calls", action="store_false",
                        help='leave tool_choice "auto" calls free (by default they are held to a listed tool and '
                             "its schema; required and named choices always are)")
    parser.add_argument("--default-max-tokens", type=int, default=16,
                        help="max_tokens of requests that give none (vLLM's default: 16)")
    parser.add_argument("--response-busy-fraction", type=float, default=0.25,
                        help="flint_model: when many streams run, outputs wait a few steps and go out together "
                             "so that its response thread is busy at most this share of the time (0: a response "
                             "a step; default 0.25)")
    parser.add_argument("--gpus", help="one engine per GPU: comma-separated CUDA ids, or 'all' (KIND_GPU)")
    parser.add_argument("--instances", type=int, help="N CPU engines (KIND_CPU); with --gpus, N per GPU")
    return parser


def _converter(annotation: str):
    kind = (int if annotation.startswith("int") else float if annotation.startswith("float")
            else _boolean if annotation.startswith("bool") else str)
    optional = "None" in annotation

    def convert(text: str):
        if optional and text.lower() in ("none", "null"):
            return None
        return kind(text)
    return convert


def _boolean(text: str) -> bool:
    """A bool engine arg's flag value: true/false (also 1/0, yes/no), any case."""
    value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value


def engine_args(args: argparse.Namespace, json_dir: Path) -> EngineArgs:
    given = {f.name: getattr(args, f.name) for f in fields(EngineArgs) if getattr(args, f.name) is not None}
    if args.model_positional:
        if "model" in given:
            sys.exit("configure: give the model once (MODEL or --model)")
        if args.model_positional.lower() in ("true", "false") and not Path(args.model_positional).exists():
            switch = SWITCHES[0].replace("_", "-")
            sys.exit(f"configure: MODEL: got {args.model_positional!r}, expected a path or a Hugging Face repo id "
                     f"(a switch such as --{switch} takes no value: --no-{switch} turns it off)")
        given["model"] = args.model_positional
    for key in PATH_KEYS:
        if key in given:
            given[key] = _stored_path(resolve_model_path(given[key], "--" + key.replace("_", "-")), given[key], json_dir)
    return EngineArgs.from_dict(given)  # validates


def _stored_path(resolved: str, given: str, json_dir: Path) -> str:
    if Path(given).expanduser().is_absolute() or not Path(given).exists():
        return resolved  # absolute, or found in the HF cache
    return os.path.relpath(resolved, json_dir)


def gpu_ids(text: str | None) -> list[int] | None:
    if text is None:
        return None
    if text == "all":
        import torch

        count = torch.cuda.device_count()
        if count == 0:
            raise ValueError("--gpus all: this machine shows no CUDA GPU")
        return list(range(count))
    try:
        return [int(g) for g in text.split(",")]
    except ValueError:
        raise ValueError(f"--gpus: expected 'all' or comma-separated GPU ids like 0,1, got {text!r}") from None


def engine_instance_group(args: argparse.Namespace, device: str) -> str:
    gpus = gpu_ids(args.gpus)
    if gpus is not None and device not in ("auto", "cuda"):
        raise ValueError(f"--device {device} with --gpus: each instance runs on the GPU Triton gives it; "
                         "leave --device out or give 'cuda'")
    if gpus is None and args.instances is not None and device.startswith("cuda"):
        raise ValueError(f"--instances with --device {device}: --instances alone makes CPU engines; "
                         "give --gpus for GPU engines")
    return instance_group(gpus, args.instances)


def set_parameters(pbtxt: str, values: dict[str, str], name: Path = TOKENIZER_CONFIG) -> str:
    for key, value in values.items():
        pattern = re.compile(r'(parameters\s*\{\s*key:\s*"' + re.escape(key) + r'"\s*value:\s*\{\s*string_value:\s*")[^"]*(")')
        pbtxt, count = pattern.subn(lambda m: m.group(1) + value + m.group(2), pbtxt)
        if count != 1:
            raise ValueError(f"{name}: expected one parameter {key!r}, found {count}")
    return pbtxt


def copy_models(source: Path, dest: Path) -> None:
    """source's files over dest (a repository configured before keeps nothing of its own but
    extra files); nothing when they are the same folder."""
    if dest.exists() and dest.resolve() == source.resolve():
        return
    shutil.copytree(source, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    json_path = engine_args_path(args.repository)
    try:
        options = ChatOptions(args.enable_auto_tool_choice, args.tool_call_parser or None, args.reasoning_parser or None,
                              args.exclude_tools_when_tool_choice_none, args.constrain_auto_tool_calls)
        engine = engine_args(args, json_path.parent)
        if args.default_max_tokens < 1:
            raise ValueError(f"--default-max-tokens: expected a positive integer, got {args.default_max_tokens}")
        pbtxt = set_parameters((args.source / TOKENIZER_CONFIG).read_text(), {
            "enable_auto_tool_choice": str(options.enable_auto_tool_choice).lower(),
            "tool_call_parser": options.tool_call_parser or "", "reasoning_parser": options.reasoning_parser or "",
            "exclude_tools_when_tool_choice_none": str(options.exclude_tools_when_tool_choice_none).lower(),
            "constrain_auto_tool_calls": str(options.constrain_auto_tool_calls).lower(),
            "default_max_tokens": str(args.default_max_tokens)})
        group = engine_instance_group(args, engine.device)
        busy = checked_busy_fraction(args.response_busy_fraction, "--response-busy-fraction")
        engine_config = set_parameters(set_instance_group((args.source / ENGINE_CONFIG).read_text(), group),
                                       {"response_busy_fraction": str(busy)}, ENGINE_CONFIG)
        copy_models(args.source, args.repository)
    except (ValueError, OSError) as error:
        sys.exit(f"configure: {error}")
    json_path.write_text(json.dumps(engine.to_dict(), indent=2) + "\n")
    (args.repository / TOKENIZER_CONFIG).write_text(pbtxt)
    (args.repository / ENGINE_CONFIG).write_text(engine_config)
    print(f"configured {args.repository}: model={describe_model(engine)} device={engine.device} "
          f"kernel_backend={engine.kernel_backend}; {group}; chat: {options}")


def describe_model(engine: EngineArgs) -> str:
    if engine.model is not None:
        return engine.model
    return f"random {engine.preset} (seed {engine.seed}{', ' + engine.quantization if engine.quantization else ''})"


if __name__ == "__main__":
    main()
