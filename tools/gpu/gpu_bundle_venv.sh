# shellcheck shell=bash
# Sourced by the GPU checks (gpu_serve_check.sh, multi_gpu_check.sh) from the project root:
#   source tools/gpu/gpu_bundle_venv.sh BUNDLE [cpu]     (cpu: a dry run without a GPU)
# unpacks BUNDLE (tools/gpu/pack_gpu_bundle.sh) into build/gpu_bundle and makes a venv there that
# sees the image's torch / triton / transformers with the bundle's numpy 1.26 in front (the 2.51
# stub needs numpy<2), tritonserver 2.51 as the installed nvidia-pytriton wheel, and the project
# on PYTHONPATH. Sets W (the folder) and VPY (the venv's python). Needs a `step` function.
# The image's python3 is itself a venv (/opt/torch/.venv): a venv made from it with
# --system-site-packages would see the base interpreter's packages, not torch. So a .pth file in
# the new venv adds python3's own site directories (and runs their .pth files) after the venv's.
W=build/gpu_bundle
BUNDLE=$1 BUNDLE_DEVICE=${2:-cuda}
step "unpack $BUNDLE"
rm -rf "$W" && mkdir -p "$W" && tar -C "$W" -xJf "$BUNDLE"
[ "$(cat "$W/ARCH")" = "$(uname -m)" ] || { echo "bundle is for $(cat "$W/ARCH"), this is $(uname -m)" >&2; exit 1; }

step "venv over the image's packages, numpy 1.26 in front"
python3 -m venv --without-pip "$W/venv"
VPY=$PWD/$W/venv/bin/python
SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -c 'import sys; print("\n".join(f"import site; site.addsitedir({p!r})" for p in sys.path
                                       if p.endswith(("site-packages", "dist-packages"))))' > "$SITE/zz_image_site.pth"
# the image's scipy / scikit-learn are built for numpy 2, and transformers imports scikit-learn
# (generation utils) when it is installed: hidden here, so numpy 1.26 can stay in front
echo "import sys; sys.modules.setdefault('sklearn', None)" > "$SITE/zz_hide_sklearn.pth"
python3 -m pip install -q --no-index --no-deps --target "$SITE" "$W"/wheels/*.whl
cp -r "$W/pytriton" "$W/nvidia_pytriton.libs" "$SITE/"
ln -sfn "$PWD/flint_kernels" "$SITE/flint_kernels"
export PYTHONPATH=$PWD
"$VPY" - "$(cat "$W/PYVER" 2>/dev/null || echo 3.12)" "$BUNDLE_DEVICE" <<'PY'
import sys, sysconfig, os
import numpy, torch, triton, transformers
from transformers import AutoTokenizer  # noqa: F401  (imports the generation utils)
v = f"{sys.version_info[0]}.{sys.version_info[1]}"
lib = os.path.join(sysconfig.get_config_var("LIBDIR") or "", f"libpython{v}.so.1.0")
print(f"python {sys.version.split()[0]} numpy {numpy.__version__} torch {torch.__version__} triton {triton.__version__} "
      f"transformers {transformers.__version__} cuda {torch.cuda.is_available()} libpython {os.path.exists(lib)}")
assert numpy.__version__.startswith("1."), "numpy 1.26 must win in the stub's environment"
assert v == sys.argv[1], f"the bundle has the stub for Python {sys.argv[1]}, not {v}"
assert sys.argv[2] == "cpu" or torch.cuda.is_available(), "no CUDA GPU"
if not os.path.exists(lib):
    import ctypes.util
    assert ctypes.util.find_library(f"python{v}"), f"libpython{v}.so is missing: the Python backend stub links it"
PY
