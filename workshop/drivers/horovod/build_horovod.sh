#!/usr/bin/env bash
# Build Horovod 0.28.1 from its PyPI source distribution for today's frameworks, with Gloo.
#
#   build_horovod.sh [--python PY] [--frameworks pytorch,tensorflow] [--wheel-dir DIR] [--install] [--gpu]
#                    [--cache-dir DIR | --no-cache]
#
# One script, three users: the workshop's set-up (`make horovod`, through
# scripts/build_horovod.sh, which adds a wheel cache and checks), lab 2's one-host SageMaker
# *build job* (hvd_build.py, run once per image and Horovod version by workshop.launchers.horovod: no
# current SageMaker image ships Horovod), and 2_horovod/docker/Dockerfile (a reusable image).
# It ships in the driver folder, so a job has it.
#
# The wheel cache: before compiling, a wheel from the set-up's cache
# (${WORKSHOP_CACHE_DIR:-~/.cache/distributed-training-workshop}/wheels, or --cache-dir) is taken
# when its `<wheel>.built-for` sidecar names exactly this Horovod version, Python tag, torch and
# tensorflow versions and patch revision (what scripts/build_horovod.sh writes). Only the
# workshop's own machines (and CI, whose build jobs run in the workshop's environment) have that
# cache; a SageMaker instance has none, so there it always compiles. `--gpu` never uses it.
#
# Horovod 0.28.1 is source-only on PyPI and does not build as published against current
# PyTorch and TensorFlow. Three patches, each checked to apply:
#   1. horovod/torch/CMakeLists.txt: C++14 -> C++17 for the PyTorch extension (PyTorch 2.x
#      headers need C++17).
#   2. horovod/tensorflow/CMakeLists.txt: `xla_mpi_ops.cc` left out of the TensorFlow target. It
#      includes XLA headers current TensorFlow wheels no longer ship and only provides the
#      optional XLA ops (HOROVOD_ENABLE_XLA_OPS).
#   3. CMakeLists.txt (top level): C++14 -> C++17, so the plain `gloo` library the PyTorch
#      extension links is compiled like the extension (else the link fails with "multiple
#      definition of gloo::rendezvous::Store::kDefaultTimeout": a static constexpr member is
#      implicitly inline in C++17 but defined out of line in gloo's C++14 store.cc).
#
# The frameworks to build for default to those importable by PY. CPU collectives use Gloo
# (no MPI needed; the workshop's driver launches ranks without mpirun). `--gpu` adds
# HOROVOD_GPU_OPERATIONS=NCCL (GPU tensors reduced by NCCL); it needs the CUDA toolkit and NCCL
# headers, as in SageMaker's GPU training images. Without it the build is CPU-only even where an
# `nvcc` is on PATH (a GPU build on a machine without the CUDA runtime fails at configure time).
set -euo pipefail

HVD_VERSION=0.28.1
PY="$(command -v python3 || command -v python)"
FRAMEWORKS=""
WHEEL_DIR=""
INSTALL=0
GPU=0
# The patch set's revision: equal to scripts/build_horovod.sh's PATCH_REV (a test keeps them equal).
PATCH_REV=3
CACHE_DIR="${WORKSHOP_CACHE_DIR:-${HOME:-/root}/.cache/distributed-training-workshop}/wheels"
JOBS="${HOROVOD_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"
while [ $# -gt 0 ]; do
    case "$1" in
        --python) PY="$2"; shift 2 ;;
        --frameworks) FRAMEWORKS="$2"; shift 2 ;;
        --wheel-dir) WHEEL_DIR="$2"; shift 2 ;;
        --install) INSTALL=1; shift ;;
        --gpu) GPU=1; shift ;;
        --cache-dir) CACHE_DIR="$2"; shift 2 ;;
        --no-cache) CACHE_DIR=""; shift ;;
        -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
log() { echo "[build_horovod] $*"; }

if [ -z "$FRAMEWORKS" ]; then
    FRAMEWORKS="$("$PY" - <<'PYEOF'
import importlib.util
print(",".join(n for n, m in (("pytorch", "torch"), ("tensorflow", "tensorflow")) if importlib.util.find_spec(m)))
PYEOF
)"
fi
[ -n "$FRAMEWORKS" ] || { echo "neither torch nor tensorflow is importable by $PY: nothing to build Horovod for" >&2; exit 1; }
with_torch=0; with_tf=0
case ",$FRAMEWORKS," in *,pytorch,*) with_torch=1 ;; esac
case ",$FRAMEWORKS," in *,tensorflow,*) with_tf=1 ;; esac
[ $((with_torch + with_tf)) -gt 0 ] || { echo "--frameworks takes pytorch and/or tensorflow, got '$FRAMEWORKS'" >&2; exit 2; }

start=$SECONDS
work="$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
built=()

# A wheel built earlier for exactly this environment (the workshop's set-up cache), if any.
if [ $GPU = 0 ] && [ -n "$CACHE_DIR" ] && [ -d "$CACHE_DIR" ]; then
    read -r PY_TAG TORCH_VER TF_FOR < <("$PY" - <<'PYEOF'
import sys
from importlib.metadata import PackageNotFoundError, version
def v(name):  # the distribution and its version: tensorflow-cpu is the same module, other headers
    for dist in (name, name + "-cpu"):
        try:
            return f"{dist}={version(dist)}"
        except PackageNotFoundError:
            pass
    return f"{name}=none"
print(f"cp{sys.version_info[0]}{sys.version_info[1]}", v("torch").split("=")[1], v("tensorflow"))
PYEOF
)
    BUILT_FOR="horovod=$HVD_VERSION python=$PY_TAG torch=$TORCH_VER $TF_FOR patches=$PATCH_REV"
    for whl in "$CACHE_DIR"/horovod-"$HVD_VERSION"-"$PY_TAG"-*.whl; do
        if [ -f "$whl" ] && [ -f "$whl.built-for" ] && [ "$(cat "$whl.built-for")" = "$BUILT_FOR" ]; then
            built=("$whl")
            log "source: cached wheel $whl, built for the same $BUILT_FOR; nothing compiled"
            break
        fi
    done
    [ ${#built[@]} -gt 0 ] || log "no cached wheel in $CACHE_DIR for $BUILT_FOR: compiling"
fi

if [ ${#built[@]} -eq 0 ]; then
log "building horovod $HVD_VERSION for $FRAMEWORKS with $PY ($JOBS jobs)"
command -v cmake >/dev/null 2>&1 || "$PY" -m pip install --quiet "cmake<4"
"$PY" -m pip download --quiet --no-deps --no-binary :all: -d "$work" "horovod==$HVD_VERSION"
tar -xzf "$work/horovod-$HVD_VERSION.tar.gz" -C "$work"
src="$work/horovod-$HVD_VERSION"

# Apply a sed edit and fail loudly if it changed nothing (the sdist is pinned, so it must apply).
patch_sed() {  # patch_sed FILE SED-EXPR GREP-AFTER
    local before; before="$(md5sum "$src/$1")"
    sed -i "$2" "$src/$1"
    [ "$(md5sum "$src/$1")" != "$before" ] && grep -q -- "$3" "$src/$1" \
        || { echo "patch did not apply: $1: $2" >&2; exit 1; }
}
patch_sed horovod/torch/CMakeLists.txt \
    's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' 'set(CMAKE_CXX_STANDARD 17)'
patch_sed horovod/tensorflow/CMakeLists.txt \
    '/list(APPEND TF_SOURCES .*xla_mpi_ops.cc")/d' 'mpi_ops.cc'
patch_sed CMakeLists.txt \
    's/^set(CMAKE_CXX_STANDARD 14)$/set(CMAKE_CXX_STANDARD 17)/' '^set(CMAKE_CXX_STANDARD 17)$'
! grep -q xla_mpi_ops "$src/horovod/tensorflow/CMakeLists.txt" \
    || { echo "xla_mpi_ops.cc still in the TF target" >&2; exit 1; }

flags=(HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO)
if [ $with_torch = 1 ]; then flags+=(HOROVOD_WITH_PYTORCH=1); else flags+=(HOROVOD_WITHOUT_PYTORCH=1); fi
if [ $with_tf = 1 ]; then flags+=(HOROVOD_WITH_TENSORFLOW=1); else flags+=(HOROVOD_WITHOUT_TENSORFLOW=1); fi
if [ $GPU = 1 ]; then flags+=(HOROVOD_GPU_OPERATIONS=NCCL); fi
log "flags: ${flags[*]}"
env "${flags[@]}" MAKEFLAGS="-j$JOBS" \
    "$PY" -m pip wheel --no-deps --no-build-isolation -w "$work/dist" "$src" >"$work/build.log" 2>&1 \
    || { tail -n 60 "$work/build.log" >&2; cp "$work/build.log" "${TMPDIR:-/tmp}/horovod-build-failed.log";
         echo "build failed; full log: ${TMPDIR:-/tmp}/horovod-build-failed.log" >&2; exit 1; }
built=("$work"/dist/horovod-"$HVD_VERSION"-*.whl)
log "source: compiled $(basename "${built[0]}") in $((SECONDS - start)) s"
fi
if [ -n "$WHEEL_DIR" ]; then
    mkdir -p "$WHEEL_DIR"
    cp "${built[0]}" "$WHEEL_DIR/"
    log "wheel: $WHEEL_DIR/$(basename "${built[0]}")"
fi
if [ $INSTALL = 1 ]; then
    "$PY" -m pip install --quiet --no-deps --force-reinstall "${built[0]}"
    "$PY" -m pip install --quiet cffi cloudpickle packaging psutil pyyaml  # Horovod's own requirements
    log "installed into $PY"
fi
