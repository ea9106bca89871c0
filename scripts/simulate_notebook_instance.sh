#!/usr/bin/env bash
# Does the workshop fit a default SageMaker notebook instance? A rerunnable simulation (as root, on
# Linux with loop devices and cgroups), of what an attendee's instance goes through:
#
#   1. its ML storage volume: a 5 GiB ext4 file system on a loop device, mounted where the notebook
#      user's /home/ec2-user/SageMaker would be (here under a scratch folder);
#   2. the default code repository cloned into it (this checkout's HEAD: commit what you measure);
#   3. the lifecycle scripts' set-up (scripts/notebook-instance/on-create.sh, which returns at once
#      and sets up in the background) and then every lab once (`make workshop`), all inside a cgroup
#      of 4 GiB of memory and 2 CPUs (an ml.t3.medium: 2 vCPUs, 4 GiB);
#   4. a stop/start: every process killed, the volume unmounted and mounted again, and everything
#      outside it lost (the user's home folder, with the Jupyter kernel registration and ~/.cache);
#      then on-start.sh, the kernel executing a cell, and every lab once more.
# It prints the minutes of each phase, the peak memory, and the free space after the labs, and
# exits non-zero when less than 1.5 GiB is free (or a phase fails). It cleans up after itself
# (processes, mount, loop device, cgroup, scratch folder) however it ends, Ctrl-C included.
#
# Usage: sudo scripts/simulate_notebook_instance.sh [--cache DIR] [--keep] [--size 5G] [--memory 4G] [--cpus 2]
#   --cache DIR  the notebook user's ~/.cache (pip's cache, the Horovod wheel cache) is DIR, kept
#                between runs; by default a fresh one, as on a new instance (the first set-up then
#                downloads every package and compiles Horovod). Either way it is off the volume: on an
#                instance ~/.cache is on the root volume.
#   --keep       keep the scratch folder (volume image, logs) for a look afterwards
# What differs from a real instance: the machine's own Python 3.11 is used (on AL2023 on-create.sh
# installs python3.11 with dnf), the notebook user is root, and pip reads this machine's pip
# configuration (package indexes, find-links).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIZE=5G MEMORY=4G CPUS=2 CACHE="" KEEP=0
MIN_FREE_MIB=1536
while [ $# -gt 0 ]; do
    case "$1" in
        --cache) CACHE="$(realpath -m "$2")"; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --size) SIZE="$2"; shift 2 ;;
        --memory) MEMORY="$2"; shift 2 ;;
        --cpus) CPUS="$2"; shift 2 ;;
        -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "run as root (a loop device, a mount and a cgroup need it): sudo $0" >&2; exit 1; }
for tool in losetup mkfs.ext4 mount umount git make flock; do
    command -v "$tool" >/dev/null || { echo "$tool is needed" >&2; exit 1; }
done
# The interpreter itself (not a shim such as pyenv's, which would look for its own HOME).
PY="$("$(command -v python3.11 || command -v python3)" -c 'import sys; print(sys.executable)')"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "a Python 3.11+ is needed (found $PY)" >&2; exit 1; }

SIM="$(mktemp -d /tmp/nbsim.XXXXXX)"
NB_USER_HOME="$SIM/home/ec2-user"        # on the root volume: lost at a stop/start
NB_HOME="$NB_USER_HOME/SageMaker"        # the ML storage volume
REPO="$NB_HOME/distributed-training-workshop"
IMG="$SIM/ml-storage-volume.img"
LOOP="" CG_PROCS=() CG_DIRS=() SAMPLER=""
say() { echo "[simulate] $(date -u +%H:%M:%S) $*"; }

# ----------------------------------------------------------------------------------- clean-up
kill_cgroup() {  # every process in the cgroup, as a stop does
    local procs pid round
    for round in 1 2 3 4 5; do
        procs=""
        for f in "${CG_PROCS[@]}"; do [ -f "$f" ] && procs+=" $(cat "$f" 2>/dev/null)"; done
        [ -n "${procs// /}" ] || return 0
        for pid in $procs; do kill -KILL "$pid" 2>/dev/null || true; done
        sleep 1
    done
}
unmount() {  # the volume; a process killed a moment ago may still be writing
    local _
    for _ in $(seq 20); do
        mountpoint -q "$NB_HOME" 2>/dev/null || return 0
        umount "$NB_HOME" 2>/dev/null && return 0
        sleep 1
    done
    umount -l "$NB_HOME"
}
cleanup() {
    local rc=$? _
    trap - EXIT INT TERM
    [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null || true
    kill_cgroup || true
    unmount || true
    if [ -n "$LOOP" ]; then  # the kernel detaches it once nothing holds it (a lazy unmount: later)
        losetup -d "$LOOP" 2>/dev/null || true
        for _ in $(seq 30); do losetup -j "$IMG" 2>/dev/null | grep -q . || break; sleep 1; done
        losetup -j "$IMG" 2>/dev/null | grep -q . && say "$LOOP is still attached to $IMG: detach it with losetup -d $LOOP"
    fi
    local d
    for d in "${CG_DIRS[@]}"; do [ -d "$d" ] && rmdir "$d" 2>/dev/null || true; done
    if [ "$KEEP" = 1 ]; then say "kept $SIM"; else rm -rf "$SIM"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM

# ------------------------------------------------------------------------------------ cgroup
# cgroup v2 where its memory controller is (the unified hierarchy), else v1's memory, cpu, cpuset.
CG_NAME="workshop-nbsim-$$"
cpus_list="$(seq -s, 0 $((CPUS - 1)))"
bytes() { numfmt --from=iec "$1"; }
unified=""
for d in /sys/fs/cgroup /sys/fs/cgroup/unified; do
    [ -f "$d/cgroup.controllers" ] && grep -qw memory "$d/cgroup.controllers" && { unified="$d"; break; }
done
if [ -n "$unified" ]; then
    CG_VERSION=2
    for c in memory cpu cpuset; do echo "+$c" >"$unified/cgroup.subtree_control" 2>/dev/null || true; done
    CG="$unified/$CG_NAME"; mkdir "$CG"; CG_DIRS=("$CG"); CG_PROCS=("$CG/cgroup.procs")
    echo "$(bytes "$MEMORY")" >"$CG/memory.max"
    [ -f "$CG/memory.swap.max" ] && echo 0 >"$CG/memory.swap.max"
    [ -f "$CG/cpu.max" ] && echo "$((CPUS * 100000)) 100000" >"$CG/cpu.max"
    [ -f "$CG/cpuset.cpus" ] && echo "$cpus_list" >"$CG/cpuset.cpus"
    mem_usage() { cat "$CG/memory.current"; }
    mem_inactive() { awk '$1 == "inactive_file" {print $2}' "$CG/memory.stat"; }
    mem_anon() { awk '$1 == "anon" || $1 == "shmem" {s += $2} END {printf "%.0f\n", s}' "$CG/memory.stat"; }
    oom_kills() { awk '$1 == "oom_kill" {print $2}' "$CG/memory.events"; }
else
    CG_VERSION=1
    for c in memory cpu cpuset; do
        [ -d "/sys/fs/cgroup/$c" ] || { echo "no cgroup v2 memory controller and no v1 $c hierarchy" >&2; exit 1; }
        mkdir "/sys/fs/cgroup/$c/$CG_NAME"
        CG_DIRS+=("/sys/fs/cgroup/$c/$CG_NAME"); CG_PROCS+=("/sys/fs/cgroup/$c/$CG_NAME/cgroup.procs")
    done
    CG="/sys/fs/cgroup/memory/$CG_NAME"
    echo "$(bytes "$MEMORY")" >"$CG/memory.limit_in_bytes"
    [ -f "$CG/memory.memsw.limit_in_bytes" ] && echo "$(bytes "$MEMORY")" >"$CG/memory.memsw.limit_in_bytes" 2>/dev/null || true
    echo 100000 >"/sys/fs/cgroup/cpu/$CG_NAME/cpu.cfs_period_us"
    echo "$((CPUS * 100000))" >"/sys/fs/cgroup/cpu/$CG_NAME/cpu.cfs_quota_us"
    cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/$CG_NAME/cpuset.mems"
    echo "$cpus_list" >"/sys/fs/cgroup/cpuset/$CG_NAME/cpuset.cpus"
    mem_usage() { cat "$CG/memory.usage_in_bytes"; }
    mem_inactive() { awk '$1 == "total_inactive_file" {print $2}' "$CG/memory.stat"; }
    mem_anon() { awk '$1 == "total_rss" || $1 == "total_shmem" {s += $2} END {printf "%.0f\n", s}' "$CG/memory.stat"; }
    oom_kills() { awk '$1 == "oom_kill" {print $2}' "$CG/memory.oom_control"; }
fi
say "cgroup v$CG_VERSION $CG_NAME: memory $MEMORY, CPUs $cpus_list ($CPUS), swap none"

# Peak memory of a phase, sampled each second: the processes' own memory (anonymous and shared
# memory, which without swap nothing but an OOM kill gives back), and the working set (that plus the
# file cache in active use, e.g. the frameworks' mapped libraries; what `docker stats` and the kubelet
# report; the kernel reclaims part of it under the limit).
start_sampler() {
    echo "0 0" >"$SIM/peak"
    ( anon_peak=0 ws_peak=0; while :; do
        anon=$(mem_anon) ws=$(( $(mem_usage) - $(mem_inactive) ))
        [ "$anon" -gt "$anon_peak" ] && anon_peak=$anon
        [ "$ws" -gt "$ws_peak" ] && ws_peak=$ws
        echo "$anon_peak $ws_peak" >"$SIM/peak.new" && mv "$SIM/peak.new" "$SIM/peak"
        sleep 1
      done ) &
    SAMPLER=$!
}
stop_sampler() { kill "$SAMPLER" 2>/dev/null || true; wait "$SAMPLER" 2>/dev/null || true; SAMPLER=""; }
mib() { echo $(( $1 / 1048576 )); }

# pip's configuration as this machine has it (package indexes, find-links): on an instance, torch's CPU
# build comes from download.pytorch.org (the Makefile's TORCH_INDEX); a machine that cannot reach it
# needs it from its own configuration, or pip takes PyPI's CUDA build (and 2 GB of CUDA libraries).
# The notebook user's HOME is another folder, so the per-user file is named explicitly.
PIP_ENV=()
while IFS= read -r var; do PIP_ENV+=("$var"); done < <(env | grep '^PIP_' || true)
if [ -z "${PIP_CONFIG_FILE:-}" ]; then
    for f in "${XDG_CONFIG_HOME:-$HOME/.config}/pip/pip.conf" "$HOME/.pip/pip.conf"; do
        if [ -f "$f" ]; then PIP_ENV+=("PIP_CONFIG_FILE=$f"); break; fi
    done
fi

# A command inside the cgroup, as the notebook user would run it (HOME on the root volume).
in_cgroup() {
    env -i PATH="/usr/sbin:/usr/bin:/sbin:/bin" HOME="$NB_USER_HOME" LANG=C.UTF-8 TERM=dumb "${PIP_ENV[@]}" \
        WORKSHOP_NB_HOME="$NB_HOME" WORKSHOP_NB_USER="$(id -un)" WORKSHOP_PYTHON="$PY" \
        bash -c 'for f in '"${CG_PROCS[*]}"'; do echo $$ >"$f"; done; exec "$@"' _ "$@"
}

# ------------------------------------------------------------------------- volume and clone
say "scratch: $SIM"
truncate -s "$SIZE" "$IMG"
mkfs.ext4 -q -F "$IMG"
LOOP="$(losetup -f --show "$IMG")"
mkdir -p "$NB_HOME"
mount "$LOOP" "$NB_HOME"
say "volume: $SIZE ext4 on $LOOP at $NB_HOME ($(df -h --output=avail "$NB_HOME" | tail -1 | tr -d ' ') available)"
mkdir -p "$NB_USER_HOME"
if [ -n "$CACHE" ]; then mkdir -p "$CACHE"; ln -s "$CACHE" "$NB_USER_HOME/.cache"; fi
git clone --quiet "$ROOT" "$REPO"
say "cloned $(git -C "$REPO" log -1 --format='%h %s' | cut -c1-80)"

# ----------------------------------------------------------------------------------- phases
declare -A TOOK PEAK
phase_end() {  # name seconds
    stop_sampler
    local anon ws
    read -r anon ws <"$SIM/peak"
    if [ "$2" -lt 60 ]; then TOOK[$1]="$2 s"; else TOOK[$1]="$(awk -v s="$2" 'BEGIN {printf "%.1f min", s / 60}')"; fi
    PEAK[$1]="$(mib "$anon") | $(mib "$ws")"
    say "$1: ${TOOK[$1]}, peak memory $(mib "$anon") MiB (working set $(mib "$ws") MiB), OOM kills so far $(oom_kills)"
}

# 1. on-create.sh: returns at once, sets up in the background (its status file says when done).
say "on-create.sh"
start_sampler; t0=$SECONDS
in_cgroup bash "$REPO/scripts/notebook-instance/on-create.sh"
say "on-create.sh returned in $((SECONDS - t0)) s; $(cat "$NB_HOME/workshop-setup.status")"
until grep -qE '^(done|failed)' "$NB_HOME/workshop-setup.status"; do
    [ $((SECONDS - t0)) -lt 7200 ] || { say "the set-up took over 2 hours"; exit 1; }
    sleep 10
    # The set-up holds this lock while it runs: free, with no final status, means it was killed.
    if flock -n "$NB_HOME/.workshop/setup.lock" true && ! grep -qE '^(done|failed)' "$NB_HOME/workshop-setup.status"; then
        say "the set-up ended without a status (killed? OOM kills: $(oom_kills))"; tail -n 40 "$NB_HOME/workshop-setup.log"; exit 1
    fi
done
phase_end "set-up (on-create, in the background)" $((SECONDS - t0))
if ! grep -q '^done' "$NB_HOME/workshop-setup.status"; then
    say "the set-up failed: $(cat "$NB_HOME/workshop-setup.status")"; tail -n 40 "$NB_HOME/workshop-setup.log"; exit 1
fi

# 2. Every lab once.
# `make workshop` in the cgroup, as one phase: $1 its log's name, $2 the phase, $3 what starts it says.
run_labs() {
    local log="$SIM/$1.log" t0=$SECONDS
    say "$3"
    start_sampler
    in_cgroup make -C "$REPO" --no-print-directory workshop PYTHON="$PY" >"$log" 2>&1 \
        || { tail -n 40 "$log"; say "$2: make workshop failed"; exit 1; }
    phase_end "$2" $((SECONDS - t0))
    grep -E '^\|' "$log" || true
}
run_labs labs-1 "every lab once (make workshop)" "make workshop (every lab once)"

# 3. What is left on the volume.
sync
read -r size_b used_b avail_b < <(df -B1 --output=size,used,avail "$NB_HOME" | tail -1)
free_mib=$(mib "$avail_b")
say "volume after the set-up and every lab: $(mib "$size_b") MiB, $(mib "$used_b") MiB used, $free_mib MiB free (what ec2-user may still write)"
du -sm "$REPO/.venv" "$REPO/data" "$REPO/runs" "$NB_HOME/.workshop" 2>/dev/null | sed 's/^/[simulate]   /'
echo "[simulate]   $(du -sm --exclude=.venv --exclude=data --exclude=runs "$REPO" | cut -f1)	$REPO without .venv, data and runs"

# 4. Stop/start: kill, unmount, lose the root volume's files, mount again, on-start.sh.
say "stop: every process killed, the volume unmounted, the home folder outside it reset"
kill_cgroup
unmount
find "$NB_USER_HOME" -mindepth 1 -maxdepth 1 ! -name SageMaker -exec rm -rf {} +
if [ -n "$CACHE" ]; then ln -s "$CACHE" "$NB_USER_HOME/.cache"; fi
[ ! -e "$NB_USER_HOME/.local/share/jupyter/kernels/distributed-training-workshop" ] || { say "the kernel registration survived the stop"; exit 1; }
mount "$LOOP" "$NB_HOME"
say "start: on-start.sh"
start_sampler; t0=$SECONDS
in_cgroup bash "$REPO/scripts/notebook-instance/on-start.sh"
phase_end "on-start" $((SECONDS - t0))
say "$(cat "$NB_HOME/workshop-setup.status")"
kernel_json="$NB_USER_HOME/.local/share/jupyter/kernels/distributed-training-workshop/kernel.json"
[ -f "$kernel_json" ] || { say "on-start.sh registered no kernel ($kernel_json)"; exit 1; }
say "kernel registered again: $kernel_json"
# The kernel, as JupyterLab starts it (by its name), runs a cell with every framework of the labs.
in_cgroup "$REPO/.venv/bin/python" - <<'EOF'
import nbformat
from nbclient import NotebookClient
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
    "import sys, torch, tensorflow as tf, horovod.torch, workshop\n"
    "print(sys.executable, 'torch', torch.__version__, 'tensorflow', tf.__version__, 'horovod', horovod.__version__)")])
NotebookClient(nb, kernel_name="distributed-training-workshop", timeout=600).execute()
print("[simulate] a cell in the kernel:", "".join(o.get("text", "") for o in nb.cells[0].outputs if o.get("name") == "stdout").strip())
EOF
run_labs labs-2 "every lab again, after the restart" "make workshop again, after the restart"

# ----------------------------------------------------------------------------------- summary
echo
echo "| phase | took | peak memory, processes (MiB, of $MEMORY) | peak working set (MiB) |"
echo "|---|---|---|---|"
for phase in "set-up (on-create, in the background)" "every lab once (make workshop)" "on-start" "every lab again, after the restart"; do
    echo "| $phase | ${TOOK[$phase]} | ${PEAK[$phase]} |"
done
echo
echo "OOM kills in the cgroup: $(oom_kills); free on the $SIZE volume after the set-up and every lab: $free_mib MiB (at least $MIN_FREE_MIB needed)"
if [ "$free_mib" -lt "$MIN_FREE_MIB" ]; then
    say "FAILED: $free_mib MiB free, less than $MIN_FREE_MIB MiB"
    exit 1
fi
say "passed"
