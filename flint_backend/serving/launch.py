"""Start tritonserver on a model repository (`make serve`, the tests and the Dockerfile use this).

    python -m flint_backend.serving.launch [--model-repository build/model_repository] [--address 127.0.0.1]
    [--http-port 8000 ...] [-- extra tritonserver flags]

The default repository is the one `python -m flint_backend.serving.configure` writes; the
tracked `model_repository` is served as it is with `--model-repository model_repository`.

--address binds the HTTP, gRPC and metrics ports (tritonserver's --http-address, --grpc-address,
--metrics-address). Without it they listen on all interfaces (tritonserver's 0.0.0.0: Triton
itself is the API, as `make serve` and the Docker image serve it), unless FLINT_API_KEY is set:
then on 127.0.0.1, since a key means the OpenAI server is the front door, and Triton, which
checks no key, must not be reachable around it.

The server is the system's `tritonserver` when there is one (NVIDIA's image), else the one
the nvidia-pytriton wheel bundles (tritonserver 2.51 with the Python backend and a stub per
Python version). For the wheel's server, the Python backend (its library, utils and the
stub of this Python) is copied into a backend folder passed as --backend-directory, and:
- LD_LIBRARY_PATH gets the wheel's `nvidia_pytriton.libs` (the copied backend library
  loses the RPATH that found them) and this Python's LIBDIR (the stub links libpython);
- PATH starts with this interpreter's folder: the stub's embedded Python finds its
  packages by locating `python3` on PATH (a venv's bin finds the venv), and ignores
  PYTHONPATH, which our model.py files therefore add to sys.path themselves;
- PYTHONPATH starts with the project root, so the models import this checkout;
- numpy must be < 2 in that environment (the 2.51 stub mis-sizes FP32 outputs with numpy 2).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BACKEND_ROOT = PROJECT_ROOT / "build" / "triton_backends"
DEFAULT_REPOSITORY = PROJECT_ROOT / "build" / "model_repository"  # configure's output
ADDRESS_FLAGS = ("--http-address", "--grpc-address", "--metrics-address")
SYSTEM_SERVERS = ("/opt/tritonserver/bin/tritonserver",)


@dataclass
class ServerCommand:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # the full environment to run it in
    bundled: bool = False                               # the nvidia-pytriton wheel's server


def find_system_server() -> str | None:
    found = shutil.which("tritonserver")
    if found:
        return found
    return next((s for s in SYSTEM_SERVERS if os.access(s, os.X_OK)), None)


def pytriton_dirs() -> tuple[Path, Path]:
    """(the wheel's tritonserver folder, its nvidia_pytriton.libs), without importing pytriton."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("no tritonserver on PATH and the nvidia-pytriton wheel is not installed: "
                           "run `make serve` (installs it) or `pip install nvidia-pytriton==0.7.0`")
    root = Path(list(spec.submodule_search_locations)[0])
    return root / "tritonserver", root.parent / "nvidia_pytriton.libs"


def prepare_backends(dest: Path = DEFAULT_BACKEND_ROOT) -> Path:
    """dest/python/: the wheel's Python backend with the stub of this interpreter's version."""
    server_dir, _ = pytriton_dirs()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server_dir / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise RuntimeError(f"nvidia-pytriton has no Python backend stub for Python {version} ({stub})")
    python_dir = dest / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    backend = server_dir / "backends" / "python"
    for source in (backend / "libtriton_python.so", backend / "triton_python_backend_utils.py", stub):
        target = python_dir / source.name
        if not target.exists() or target.stat().st_size != source.stat().st_size:
            shutil.copy2(source, target)
    return dest


def check_numpy() -> None:
    import numpy

    if int(numpy.__version__.split(".")[0]) >= 2:
        raise RuntimeError(f"numpy {numpy.__version__} in {sys.prefix}: tritonserver 2.51's Python backend needs "
                           "numpy<2 (FP32 outputs come back wrong); pip install 'numpy<2'")


def default_address() -> str | None:
    """127.0.0.1 when an API key is set (the OpenAI server's FLINT_API_KEY); else tritonserver's own."""
    return "127.0.0.1" if os.environ.get("FLINT_API_KEY") else None


def address_flags(address: str | None, extra: list[str]) -> list[str]:
    """tritonserver's three address flags, except those that `extra` gives itself."""
    given = {e.split("=")[0] for e in extra}
    return [f"{flag}={address}" for flag in ADDRESS_FLAGS if address and flag not in given]


def server_command(repository: str | Path, http_port: int = 8000, grpc_port: int = 8001, metrics_port: int = 8002,
                   extra: list[str] | None = None, backend_root: Path = DEFAULT_BACKEND_ROOT,
                   use_system: bool = True, address: str | None = None) -> ServerCommand:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                               if p and p != str(PROJECT_ROOT)])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    argv = ["--model-repository", str(Path(repository).resolve()), f"--http-port={http_port}",
            f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}", *address_flags(address, extra or []),
            *(extra or [])]
    system = find_system_server() if use_system else None
    if system:
        return ServerCommand([system, *argv], env)
    check_numpy()
    server_dir, libs = pytriton_dirs()
    backends = prepare_backends(backend_root)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(libs), libdir, env.get("LD_LIBRARY_PATH", "")) if p)
    binary = server_dir / "bin" / "tritonserver"
    return ServerCommand([str(binary), *argv, f"--backend-directory={backends}"], env, bundled=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-repository", default=str(DEFAULT_REPOSITORY))
    parser.add_argument("--address", default=default_address(),
                        help="bind HTTP, gRPC and metrics to this address (default: all interfaces, "
                             "127.0.0.1 when FLINT_API_KEY is set)")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--bundled", action="store_true", help="use the nvidia-pytriton server even if tritonserver is installed")
    parser.add_argument("--print-command", action="store_true", help="print the command and exit")
    args, extra = parser.parse_known_args(argv)
    extra = [e for e in extra if e != "--"]
    if not Path(args.model_repository).is_dir():
        sys.exit(f"launch: no model repository at {args.model_repository}: write one with "
                 "`python -m flint_backend.serving.configure MODEL` (build/model_repository), or serve the "
                 "tracked default as it is with --model-repository model_repository")
    try:
        command = server_command(args.model_repository, args.http_port, args.grpc_port, args.metrics_port, extra,
                                 use_system=not args.bundled, address=args.address)
    except RuntimeError as error:
        sys.exit(f"launch: {error}")
    if args.print_command:
        for key in ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH"):
            if key in command.env:
                print(f"{key}={command.env[key]}")
        print(" ".join(command.argv))
        return
    sys.stdout.flush()
    os.execve(command.argv[0], command.argv, command.env)


if __name__ == "__main__":
    main()
