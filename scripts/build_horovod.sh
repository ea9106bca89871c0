#!/usr/bin/env bash
# Build and install Horovod 0.28.1 (TensorFlow + PyTorch, CPU, Gloo controller) into the
# workshop's venv, reproducibly and idempotently.
#
# Why a script: Horovod 0.28.1 is source-only on PyPI and does not build as published against
# the pinned frameworks (TensorFlow 2.21, PyTorch 2.13). The sdist is patched before building
# (the build itself: workshop/drivers/horovod/build_horovod.sh, shared with SageMaker jobs and
# 2_horovod/docker/Dockerfile):
#
#   1. horovod/torch/CMakeLists.txt: `set(CMAKE_CXX_STANDARD 14)` -> 17 for the PyTorch
#      extension. PyTorch 2.x headers require C++17 (the TensorFlow target already uses 17 for
#      TF >= 2.10; the top-level CMakeLists' 14 is overridden per framework subdirectory).
#   2. horovod/tensorflow/CMakeLists.txt: drop `xla_mpi_ops.cc` from the TensorFlow target.
#      It includes XLA headers that current TensorFlow wheels no longer ship; it only provides
#      the optional XLA ops (HOROVOD_ENABLE_XLA_OPS), which a CPU/Gloo build does not use.
#   3. CMakeLists.txt (top level): `set(CMAKE_CXX_STANDARD 14)` -> 17, which is what the
#      plain `gloo` static library (linked by the PyTorch extension) is compiled with. Found by
#      building: with the extension at C++17 and gloo at C++14, linking mpi_lib_v2.so fails with
#      "multiple definition of `gloo::rendezvous::Store::kDefaultTimeout'" (a static constexpr
#      member is implicitly inline in C++17 but defined out of line in gloo's C++14 store.cc).
#      The TensorFlow target already links a C++17 copy (`compatible17_gloo`).
#
# Order of work:
#   1. fast path: the venv already has horovod 0.28.1 built for the venv's torch/tensorflow;
#   2. cache: install a wheel built earlier for the same python/torch/tensorflow from
#      ${WORKSHOP_CACHE_DIR:-~/.cache/distributed-training-workshop}/wheels (a sidecar file
#      `<wheel>.built-for` records the versions it was built against);
#   3. the room's wheelhouse: WORKSHOP_WHEELHOUSE (a folder or s3://bucket/prefix an organizer
#      filled with `python -m workshop horovod publish`), when set: a wheel there whose `.built-for`
#      matches is copied into the cache and installed as in 2; one that does not match is named,
#      with what differs, and not used;
#   4. build: download the sdist, patch, `pip wheel --no-build-isolation` (the build must see
#      the venv's torch/TF), cache the wheel, install it.
# Then verify: `horovodrun --check-build` and a 2-process Gloo all-reduce for each framework.
#
# `make setup` does not wait for step 4 (6-14 minutes on 2 cores; only lab 2 needs Horovod):
# `python -m workshop.horovod_build start` runs this script with HOROVOD_COMPILE=0 and, when only a
# compile would do, runs it again in the background, leaving a status (see workshop/horovod_build.py).
#
# Usage: scripts/build_horovod.sh            (from the repository root)
# Env:   VENV (default .venv), WORKSHOP_CACHE_DIR, WORKSHOP_WHEELHOUSE, HOROVOD_BUILD_JOBS (default 2),
#        HOROVOD_SKIP_VERIFY=1 to skip the checks after a build or cache install,
#        HOROVOD_VERIFY=1 to run them on the fast path too,
#        HOROVOD_COMPILE=0 to stop with exit status 3 where step 4 would compile,
#        HOROVOD_PRINT_TARGET=1 to print the `.built-for` line this venv needs and stop.
set -euo pipefail

HVD_VERSION=0.28.1
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
CACHE_DIR="${WORKSHOP_CACHE_DIR:-$HOME/.cache/distributed-training-workshop}"
WHEEL_DIR="$CACHE_DIR/wheels"
JOBS="${HOROVOD_BUILD_JOBS:-2}"
# Bumped whenever the patch set below changes, so stale cached wheels are rebuilt.
PATCH_REV=3

export PATH="$VENV/bin:$PATH"   # horovodrun and `python` must be the venv's
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
log() { echo "[build_horovod] $*"; }

[ -x "$PY" ] || { echo "no venv python at $PY: run 'make setup' first" >&2; exit 1; }

# Versions the wheel must match (read from package metadata: no framework import needed).
# TensorFlow's distribution is `tensorflow-cpu` (requirements.txt) or `tensorflow`: the same module,
# but not the same headers (the CPU build's leave CUDA out), so a wheel records which it was built for.
read -r PY_TAG TORCH_VER TF_DIST TF_VER < <("$PY" - <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
def v(name):
    for dist in (name, name + "-cpu"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            pass
    return f"{name} none"
print(f"cp{sys.version_info[0]}{sys.version_info[1]}", version("torch"), v("tensorflow"))
EOF
)
BUILT_FOR="horovod=$HVD_VERSION python=$PY_TAG torch=$TORCH_VER $TF_DIST=$TF_VER patches=$PATCH_REV"
if [ "${HOROVOD_PRINT_TARGET:-0}" = 1 ]; then echo "$BUILT_FOR"; exit 0; fi
log "target: $BUILT_FOR"

# True when the venv's horovod is $HVD_VERSION, was built with both frameworks at the venv's
# versions (horovod/metadata.json records them), and both framework modules import.
installed_ok() {
    "$PY" - "$HVD_VERSION" "$TORCH_VER" "$TF_VER" <<'EOF' 2>/dev/null
import json, os, sys
from importlib.metadata import version, PackageNotFoundError
want, torch_v, tf_v = sys.argv[1:]
try:
    if version("horovod") != want:
        sys.exit(1)
except PackageNotFoundError:
    sys.exit(1)
import horovod
meta = json.load(open(os.path.join(os.path.dirname(horovod.__file__), "metadata.json")))
if meta.get("pytorch") not in (torch_v, torch_v.split("+")[0]) or meta.get("tensorflow") != tf_v:
    print(f"built for {meta}, venv has torch {torch_v}, tensorflow {tf_v}", file=sys.stderr)
    sys.exit(1)
import horovod.torch, horovod.tensorflow  # noqa: E401  (loads both native extensions)
EOF
}

verify() {
    if [ "${HOROVOD_SKIP_VERIFY:-0}" = 1 ]; then return 0; fi
    log "horovodrun --check-build:"
    horovodrun --check-build
    local tmp; tmp="$(mktemp -d)"
    cat >"$tmp/smoke_torch.py" <<'EOF'
import torch
import horovod.torch as hvd
hvd.init()
t = torch.full((3,), float(hvd.rank() + 1))
s = hvd.allreduce(t, op=hvd.Sum, name="smoke")
expect = float(sum(range(1, hvd.size() + 1)))
assert torch.equal(s, torch.full((3,), expect)), s
if hvd.rank() == 0:
    print(f"torch allreduce OK: size={hvd.size()} sum={s.tolist()}", flush=True)
EOF
    cat >"$tmp/smoke_tf.py" <<'EOF'
import tensorflow as tf
import horovod.tensorflow as hvd
hvd.init()
t = tf.fill([3], float(hvd.rank() + 1))
s = hvd.allreduce(t, op=hvd.Sum, name="smoke")
expect = float(sum(range(1, hvd.size() + 1)))
assert s.numpy().tolist() == [expect] * 3, s
if hvd.rank() == 0:
    print(f"tensorflow allreduce OK: size={hvd.size()} sum={s.numpy().tolist()}", flush=True)
EOF
    for fw in torch tf; do
        log "smoke ($fw): horovodrun --gloo -np 2 -H localhost:2 python smoke_$fw.py"
        timeout 300 horovodrun --gloo -np 2 -H localhost:2 python "$tmp/smoke_$fw.py"
    done
    # horovod.tensorflow.keras needs Keras 2 (tf-keras, TF_USE_LEGACY_KERAS=1). Under TF 2.21's
    # default Keras 3 it still imports, but fails on use, so check a 1-process model.fit.
    # requirements-no-deps.txt installs tf-keras without its requirement on the full `tensorflow`
    # distribution (tensorflow-cpu provides the module); where it is missing, this check is skipped.
    cat >"$tmp/keras_fit.py" <<'EOF'
import numpy as np
import horovod.tensorflow.keras as hvd
hvd.init()
import tensorflow as tf
keras = tf.keras
m = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(1)])
m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
m.fit(np.ones((8, 4), "float32"), np.ones((8, 1), "float32"), epochs=1, verbose=0,
      callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
EOF
    local err
    if ! python -c 'import tf_keras' >/dev/null 2>&1; then
        log "horovod.tensorflow.keras fit with TF_USE_LEGACY_KERAS=1 (tf-keras): not checked, tf-keras is not installed (pip install --no-deps tf-keras==$TF_VER)"
    elif err="$(TF_USE_LEGACY_KERAS=1 python "$tmp/keras_fit.py" 2>&1)"; then
        log "horovod.tensorflow.keras fit with TF_USE_LEGACY_KERAS=1 (tf-keras): OK"
    else
        log "horovod.tensorflow.keras fit with TF_USE_LEGACY_KERAS=1 (tf-keras): FAILED"
        echo "$err" | tail -n 5; rm -rf "$tmp"; return 1
    fi
    if python -c 'import horovod.tensorflow.keras' >/dev/null 2>&1; then
        log "horovod.tensorflow.keras without TF_USE_LEGACY_KERAS (Keras 3): imports"
    else
        log "horovod.tensorflow.keras without TF_USE_LEGACY_KERAS (Keras 3): does not import"
    fi
    if err="$(python "$tmp/keras_fit.py" 2>&1)"; then
        log "horovod.tensorflow.keras fit without TF_USE_LEGACY_KERAS (Keras 3): OK (unexpected)"
    else
        log "horovod.tensorflow.keras fit without TF_USE_LEGACY_KERAS (Keras 3): fails (expected): $(echo "$err" | grep -E 'Error' | tail -n 1)"
    fi
    rm -rf "$tmp"
}

# 1. Fast path.
if installed_ok; then
    log "horovod $HVD_VERSION with TensorFlow and PyTorch already installed in $VENV"
    # The checks take ~1 min; on the fast path they run only when asked for.
    if [ "${HOROVOD_VERIFY:-0}" = 1 ]; then verify; fi
    exit 0
fi

# 2. Cached wheel built for the same versions (and 3., the same after copying one from the wheelhouse).
install_cached() {
    local whl
    for whl in "$WHEEL_DIR"/horovod-"$HVD_VERSION"-"$PY_TAG"-*.whl; do
        if [ -f "$whl" ] && [ -f "$whl.built-for" ] && [ "$(cat "$whl.built-for")" = "$BUILT_FOR" ]; then
            log "installing cached wheel $whl"
            "$PY" -m pip install --quiet --no-deps --force-reinstall "$whl"
            installed_ok || { echo "cached wheel $whl installed but does not import" >&2; exit 1; }
            verify
            exit 0
        fi
    done
}
install_cached

# 3. The room's wheelhouse: copies a matching wheel into the cache, or says why none is used.
if [ -n "${WORKSHOP_WHEELHOUSE:-}" ]; then
    log "looking in the wheelhouse $WORKSHOP_WHEELHOUSE"
    if "$PY" -m workshop.horovod_build fetch --into "$WHEEL_DIR" --built-for "$BUILT_FOR" | sed 's/^/[build_horovod] /'; then
        install_cached
    fi
fi

if [ "${HOROVOD_COMPILE:-1}" = 0 ]; then
    log "no installed, cached or shared wheel for $BUILT_FOR: it must be compiled (HOROVOD_COMPILE=0: not here)"
    exit 3
fi

# 4. Build from the sdist: the patched build lives in the Horovod driver's folder, so that
#    lab 2's one-host SageMaker build job (hvd_build.py) and the Dockerfile use the very same steps.
start=$SECONDS
work="$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
log "building horovod $HVD_VERSION (takes a while on few cores)"
HOROVOD_BUILD_JOBS="$JOBS" bash "$ROOT/workshop/drivers/horovod/build_horovod.sh" \
    --python "$PY" --frameworks pytorch,tensorflow --wheel-dir "$work/dist"
built=("$work"/dist/horovod-"$HVD_VERSION"-*.whl)
mkdir -p "$WHEEL_DIR"
cp "${built[0]}" "$WHEEL_DIR/"
whl="$WHEEL_DIR/$(basename "${built[0]}")"
echo "$BUILT_FOR" >"$whl.built-for"
log "cached $whl"
"$PY" -m pip install --quiet --no-deps --force-reinstall "$whl"
log "built and installed in $((SECONDS - start)) s"
installed_ok || { echo "built wheel installed but horovod.torch/horovod.tensorflow do not import" >&2; exit 1; }
verify
