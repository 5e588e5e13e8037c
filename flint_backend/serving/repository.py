"""Where the model repository keeps its configuration, and the paths it names.

Engine arguments live in ONE file, `flint_model/1/engine_args.json` (EngineArgs keys);
the tokenizer and postprocessor read the tokenizer path from it too. Relative paths in it
are relative to the file. A model given as a Hugging Face repo id (`RecursiveSI/flint`)
is looked up in the local HF cache (~/.cache/huggingface, offline); a GGUF repo resolves
to its one .gguf file. How many engines run, and where, is flint_model's `instance_group`
(one line of its config.pbtxt).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from flint_backend.chat.chat_options import ChatOptions
from flint_backend.engine.engine_args import EngineArgs, EngineArgsError

ENGINE_MODEL = "flint_model"
ENGINE_ARGS_FILE = "engine_args.json"
PATH_KEYS = ("model", "hf_config_path", "tokenizer")
INSTANCE_GROUP = re.compile(r"^instance_group\s*\[.*\]\s*$", re.M)


def engine_args_path(repository: str | Path, engine_model: str = ENGINE_MODEL) -> Path:
    return Path(repository) / engine_model / "1" / ENGINE_ARGS_FILE


def load_engine_args(path: str | Path) -> EngineArgs:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise EngineArgsError(f"{path}: {error}") from None
    for key in PATH_KEYS:
        if data.get(key):
            data[key] = str((path.parent / Path(data[key]).expanduser()).resolve())
    return EngineArgs.from_dict(data)


def tokenizer_dir(args: EngineArgs) -> Path:
    """`tokenizer`, else the checkpoint directory, else the GGUF's hf_config_path, else ours."""
    return args.tokenizer_dir()


def resolve_model_path(name: str, what: str = "--model") -> str:
    """A local path as is; otherwise a Hugging Face repo id in the local cache."""
    path = Path(name).expanduser()
    if path.exists():
        return str(path.resolve())
    if name.count("/") != 1:
        raise FileNotFoundError(f"{what}: {name!r} is neither a path nor a Hugging Face repo id (org/name)")
    from huggingface_hub import snapshot_download

    try:
        snapshot = Path(snapshot_download(name, local_files_only=True))
    except Exception as error:  # not in the cache: nothing is downloaded here
        raise FileNotFoundError(f"{what}: {name!r} is not a path and not in the local Hugging Face cache "
                                f"({type(error).__name__}); download it first or mount the cache") from None
    ggufs = sorted(snapshot.glob("*.gguf"))
    if ggufs and not list(snapshot.glob("*.safetensors")):
        if len(ggufs) > 1:
            raise FileNotFoundError(f"{what}: {name!r} holds several .gguf files ({[g.name for g in ggufs]}); "
                                    "give the file's path")
        return str(ggufs[0])
    return str(snapshot)


def model_parameters(model_config: dict) -> dict[str, str]:
    """config.pbtxt `parameters` as {key: string_value}."""
    return {k: v.get("string_value", "") for k, v in model_config.get("parameters", {}).items()}


def chat_options(params: dict[str, str]) -> ChatOptions:
    """flint_tokenizer's parameters -> the server's chat flags (the announcement's names)."""
    def flag(name: str, default: str = "false") -> bool:
        value = params.get(name, default).strip().lower()
        if value not in ("true", "false"):
            raise ValueError(f"parameter {name}: expected true or false, got {value!r}")
        return value == "true"

    return ChatOptions(enable_auto_tool_choice=flag("enable_auto_tool_choice"),
                       tool_call_parser=params.get("tool_call_parser") or None,
                       reasoning_parser=params.get("reasoning_parser") or None,
                       exclude_tools_when_tool_choice_none=flag("exclude_tools_when_tool_choice_none"),
                       constrain_auto_tool_calls=flag("constrain_auto_tool_calls", "true"))


def checked_busy_fraction(value: float, field: str) -> float:
    """value, if it is a busy fraction (response_pacing.py): a number in [0, 1); else a
    ValueError naming `field`."""
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{field}: expected a number in [0, 1), got {value!r}")
    return value


def response_busy_fraction(params: dict[str, str]) -> float:
    """flint_model's parameter: the share of time its response thread may spend sending (response_pacing.py)."""
    text = params.get("response_busy_fraction", "0")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"parameter response_busy_fraction: expected a number in [0, 1), got {text!r}") from None
    return checked_busy_fraction(value, "parameter response_busy_fraction")


def instance_group(gpus: list[int] | None = None, count: int | None = None) -> str:
    """flint_model's instance_group line: `count` engines (default 1) on each GPU of `gpus`
    (KIND_GPU); else `count` CPU engines (KIND_CPU); neither: one engine on engine_args.json's
    device (KIND_MODEL)."""
    if count is not None and count < 1:
        raise ValueError(f"--instances: expected a positive integer, got {count}")
    if gpus is not None:
        if not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0:
            raise ValueError(f"--gpus: expected distinct GPU ids >= 0, got {gpus}")
        ids = ", ".join(str(g) for g in gpus)
        return f"instance_group [ {{ kind: KIND_GPU count: {count or 1} gpus: [ {ids} ] }} ]"
    if count is not None:
        return f"instance_group [ {{ kind: KIND_CPU count: {count} }} ]"
    return "instance_group [ { kind: KIND_MODEL count: 1 } ]"


def set_instance_group(pbtxt: str, group: str) -> str:
    pbtxt, found = INSTANCE_GROUP.subn(group, pbtxt)
    if found != 1:
        raise ValueError(f"{ENGINE_MODEL}/config.pbtxt: expected one instance_group line, found {found}")
    return pbtxt
