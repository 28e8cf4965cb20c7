#!/usr/bin/env bash
# hetsched's GPU paths on a lent NVIDIA machine (the `device` tool's nvidia-h200), about 4 minutes.
#
# Run from the repository root as the device tool sends it (the working tree), with these ignored
# folders carried beside it (`.git/info/exclude` lists them):
#   .whl/   cp312 wheels of what the machine's image lacks: ncnn, pnnx, pytest-asyncio, trio, outcome, sniffio,
#           pyudev (python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 ...)
# (HS_NO_WHEELS=1: use the Python environment as it is, e.g. a dry run with PYTHON=.venv/bin/python)
#   .gl/    Debian libvulkan1 + libglvnd debs (the Vulkan loader; the NVIDIA ICD is the machine's)
# as:  bash tools/gpu_check.sh          (results under $OUT, else ./gpu_check_out)
# Every step has a timeout; a failing step does not stop the ones after it. Files in $OUT:
# gpu_check.log, probe.json, ncnn_gpu.json, junit_gpu.xml, junit_ncnn.xml.
# Without a GPU (a dry run) every GPU step says so and the script still ends with a summary.
set -u -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
OUT=${OUT:-$ROOT/gpu_check_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
PY=${PYTHON:-python3}
SITE=${HS_SITE:-/tmp/hs_site}
declare -a SUMMARY=()
LAST_RC=0

step() {  # step NAME SECONDS CMD...: run CMD under a timeout, log its exit status
    local name=$1 limit=$2 rc
    shift 2
    echo
    echo "=== $name (limit ${limit}s, $(date +%T))"
    timeout -k 5 "$limit" "$@"
    rc=$?
    [ $rc -eq 124 ] && echo "!!! $name timed out after ${limit}s"
    echo "--- $name: rc=$rc"
    SUMMARY+=("$name=$rc")
    LAST_RC=$rc
    return 0
}

# -- 1. the machine ------------------------------------------------------------------------------
step nvidia-smi 20 nvidia-smi
step versions 30 bash -c "uname -a; nproc; $PY --version; command -v $PY
    $PY -m pip list 2>/dev/null | grep -iE '^(cuda-bindings|cuda-python|cupy|cupy-cuda13x|torch|numpy|onnx|onnxruntime|anyio|pytest|trio|pytest-timeout|pytest-asyncio|tensorrt|ncnn|pnnx) '
    ldconfig -p | grep -iE 'libvulkan|libcuda\\.so' ; ls /usr/local/nvidia/share/vulkan/icd.d 2>&1; true"

# -- 2. wheels and hetsched (wheels into $SITE; hetsched laid out as its editable install maps it) --
if [ -z "${HS_NO_WHEELS:-}" ] && compgen -G ".whl/*.whl" >/dev/null; then
    step install-wheels 90 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl
else
    echo "no .whl/ folder: using the Python environment as it is"
fi
# hetsched/ + backends/ -> hetsched.backends + policies/ -> hetsched.policies (the package-dir map)
step install-hetsched 30 bash -c "rm -rf '$SITE/hetsched' && mkdir -p '$SITE' && cp -r hetsched '$SITE/hetsched' &&
    cp -r backends '$SITE/hetsched/backends' && cp -r policies '$SITE/hetsched/policies'"
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
# pnnx's binary comes out of a wheel without its executable bit
chmod +x "$SITE/pnnx/pnnx" 2>/dev/null || true
step import-check 30 "$PY" -P -c '
import hetsched, hetsched.backends._cuda as c
print("hetsched", hetsched.__file__)
try:
    rt = c.load_cudart(); print("cudart module:", rt.__name__, "cudaGetDeviceCount:", rt.cudaGetDeviceCount())
except Exception as e: print("no CUDA runtime:", type(e).__name__, e)'

# -- 3. the Vulkan loader and NVIDIA's ICD (for ncnn) ---------------------------------------------
NV_ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if ! ldconfig -p | grep -q libvulkan.so.1 && compgen -G ".gl/*.deb" >/dev/null; then
    if [ "$(id -u)" = 0 ] && [ -f "$NV_ICD" ]; then  # the device README's recipe (a lent machine is bare)
        for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
    else
        echo "not unpacking the Vulkan loader into / (not root, or no NVIDIA ICD: not the lent machine)"
    fi
fi
[ -f "$NV_ICD" ] && export VK_DRIVER_FILES=$NV_ICD VK_ICD_FILENAMES=$NV_ICD
step ncnn-gpu-count 30 "$PY" -P -c '
from hetsched.backends._ncnn_convert import ncnn_unavailable_reason, vulkan_devices
print("unavailable:", ncnn_unavailable_reason()); [print(d.describe()) for d in vulkan_devices()]'

# -- 4. the project's GPU tests and the ncnn tests ---------------------------------------------------
# -P: the repo root is not put first on sys.path (its hetsched/ lacks backends/). Plugins named
# (no autoload): the image's own pytest plugins stay out.
GPU_TESTS=$(grep -l "pytest.mark.gpu" tests/test_*.py | sort | tr '\n' ' ')
echo "GPU test files: $GPU_TESTS"
PYTEST=(env PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "$PY" -P -m pytest -p anyio.pytest_plugin -p pytest_asyncio.plugin
        -p pytest_timeout -p no:cacheprovider -o addopts= -q -rs)
step pytest-gpu 90 "${PYTEST[@]}" --basetemp=/tmp/hs_pt1 -m gpu --junitxml="$OUT/junit_gpu.xml" $GPU_TESTS
# -- 5. the CUDA memory path through hetsched's own code --------------------------------------------
step gpu-probe 120 "$PY" -P tools/gpu_probe.py "$OUT/probe.json"

NCNN_TESTS=$(ls tests/test_ncnn*.py 2>/dev/null | tr '\n' ' ')
[ -n "$NCNN_TESTS" ] && step pytest-ncnn 90 "${PYTEST[@]}" --basetemp=/tmp/hs_pt2 --junitxml="$OUT/junit_ncnn.xml" $NCNN_TESTS

# -- 6. whole models through the ncnn backend on NVIDIA's Vulkan driver ------------------------------
step ncnn-gpu-probe 100 "$PY" -P tools/ncnn_gpu_probe.py "$OUT/ncnn_gpu.json" "${NCNN_REPS:-10}"

echo
echo "=== summary: ${SUMMARY[*]}"
ls -la "$OUT"
sleep 1  # let tee write the last lines
