#!/usr/bin/env bash
# Pack what tools/gpu/gpu_serve_check.sh needs on an offline GPU machine into one tar.xz (< 64 MiB):
#   - tritonserver 2.51 from the nvidia-pytriton 0.7.0 wheel, laid out as the wheel has it
#     (pytriton/tritonserver/{bin,backends/python}, the Python 3.12 stub, nvidia_pytriton.libs
#     without the bundled libpython3.13), plus an empty pytriton/__init__.py so that
#     flint_backend.serving.launch finds it as it finds the installed wheel;
#   - wheels/: numpy 1.26.4 for CPython 3.12 (the stub's environment: the 2.51 Python backend
#     breaks FP32/BYTES tensors with numpy 2; the GPU image has numpy 2.5.2) and gguf 0.19.0
#     (flint_backend.weights imports it). The check's client is the standard library (HTTP
#     generate_stream), so no tritonclient / python-rapidjson / grpcio is needed there.
#
#   tools/gpu/pack_gpu_bundle.sh [--arch x86_64|aarch64] [--out .device/flint_gpu_bundle.tar.xz]
#                              [--python-version 3.12]   (the GPU image's; another one for CPU dry runs)
# then:  run(command="bash tools/gpu/gpu_serve_check.sh", carry=[".device/flint_gpu_bundle.tar.xz"])
set -euo pipefail
ARCH=x86_64 OUT=.device/flint_gpu_bundle.tar.xz PYVER=3.12
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) ARCH=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --python-version) PYVER=$2; shift 2 ;;
    *) echo "pack_gpu_bundle.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
PYTHON=${PYTHON:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$PYTHON" -m pip download -q --no-deps -d "$WORK/dl" --only-binary=:all: \
  --platform "manylinux_2_35_$ARCH" --python-version "$PYVER" nvidia-pytriton==0.7.0
"$PYTHON" -m pip download -q --no-deps -d "$WORK/bundle/wheels" --only-binary=:all: \
  --platform "manylinux2014_$ARCH" --python-version "$PYVER" --implementation cp numpy==1.26.4
"$PYTHON" -m pip download -q --no-deps -d "$WORK/bundle/wheels" --only-binary=:all: gguf==0.19.0
(cd "$WORK/dl" && "$PYTHON" -m zipfile -e nvidia_pytriton-*.whl wheel)
W="$WORK/dl/wheel"
B="$WORK/bundle"
mkdir -p "$B/pytriton/tritonserver/bin" "$B/pytriton/tritonserver/backends/python" \
         "$B/pytriton/tritonserver/python_backend_stubs/$PYVER" "$B/nvidia_pytriton.libs"
cp "$W/pytriton/tritonserver/bin/tritonserver" "$B/pytriton/tritonserver/bin/"
cp "$W/pytriton/tritonserver/backends/python/libtriton_python.so" \
   "$W/pytriton/tritonserver/backends/python/triton_python_backend_utils.py" "$B/pytriton/tritonserver/backends/python/"
cp "$W/pytriton/tritonserver/python_backend_stubs/$PYVER/triton_python_backend_stub" \
   "$B/pytriton/tritonserver/python_backend_stubs/$PYVER/"
find "$W/nvidia_pytriton.libs" -name '*.so*' ! -name 'libpython3*' -exec cp {} "$B/nvidia_pytriton.libs/" \;
chmod +x "$B/pytriton/tritonserver/bin/tritonserver" "$B/pytriton/tritonserver/python_backend_stubs/$PYVER/triton_python_backend_stub"
echo "# tritonserver from nvidia-pytriton 0.7.0, repacked by tools/gpu/pack_gpu_bundle.sh ($ARCH)" > "$B/pytriton/__init__.py"
echo "$ARCH" > "$B/ARCH"
echo "$PYVER" > "$B/PYVER"
mkdir -p "$(dirname "$OUT")"
tar -C "$B" -cf - . | xz -T0 -9 > "$OUT"
ls -l "$OUT"
size=$(stat -c %s "$OUT")
[ "$size" -lt $((64 * 1024 * 1024)) ] || { echo "pack_gpu_bundle.sh: $OUT is over 64 MiB" >&2; exit 1; }
