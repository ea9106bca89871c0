#!/bin/bash
# SageMaker notebook instance, lifecycle configuration "on-create": the workshop's set-up, in the
# background. Returns within seconds; the set-up (about 10 minutes, more while Horovod compiles)
# writes its log and its status on the ML storage volume, where JupyterLab's file browser opens:
#   workshop-setup.status   one line: running / done (pick the kernel) / failed (and why)
#   workshop-setup.log      everything the set-up printed
# When it is done, the kernel "Python (distributed training workshop)" is registered; every
# notebook of the workshop names it.
#
# What AWS documents, and this script follows (read 2026-11-24):
# - Lifecycle scripts run as root with PATH=/sbin:bin:/usr/sbin:/usr/bin, and fail the instance if
#   they run longer than 5 minutes: long work goes to the background with nohup; anything under
#   /home/ec2-user/SageMaker runs as ec2-user (docs.aws.amazon.com/sagemaker/latest/dg/
#   API_NotebookInstanceLifecycleHook.html, .../nbi-lifecycle-config-install.html).
# - Only /home/ec2-user/SageMaker (the ML storage volume) survives a stop/start; custom
#   environments belong there, with an on-create and an on-start script (.../nbi-add-external.html).
#   So the environment (.venv, in the checkout) is on the volume; on-start.sh puts back what a
#   restart loses.
# - Python: the Makefile needs 3.11+. notebook-al2023-v1 (the default platform since 2026-05-15)
#   ships conda kernels with Python 3.10 (.../nbi-al2023.html) and /usr/bin/python3 is 3.9 for the
#   life of AL2023, which packages python3.11 beside it (docs.aws.amazon.com/linux/al2023/ug/
#   python.html). So on AL2023: `dnf install python3.11` (on the root volume: nothing taken from the
#   5 GB volume; on-start.sh installs it again after a restart). notebook-al2-v3 (Python 3.10
#   kernels, no python3.11 package; no longer created or restarted since 2026-07-01, .../nbi-al2.html)
#   gets AWS's other way: a conda environment on the volume, made with the platform's conda.
#
# Settings (the organizer's template puts them in lines before this text; tests set them):
#   WORKSHOP_NB_HOME    the ML storage volume (default /home/ec2-user/SageMaker)
#   WORKSHOP_NB_USER    who runs the set-up (default ec2-user; no sudo when it is the current user)
#   WORKSHOP_REPO_DIR   the checkout (default: the folder under WORKSHOP_NB_HOME that holds
#                       workshop/__init__.py and a Makefile, as SageMaker clones the default code
#                       repository there)
#   WORKSHOP_WHEELHOUSE a folder or s3:// URI with a prebuilt Horovod wheel for the room (optional,
#                       passed to the set-up; see scripts/build_horovod.sh)
#   WORKSHOP_PYTHON     a Python 3.11+ to use instead of the one this script finds or installs
#   WORKSHOP_CONDA      the platform's conda (default /home/ec2-user/anaconda3/bin/conda)
set -euo pipefail

NB_HOME="${WORKSHOP_NB_HOME:-/home/ec2-user/SageMaker}"
NB_USER="${WORKSHOP_NB_USER:-ec2-user}"
CONDA="${WORKSHOP_CONDA:-/home/ec2-user/anaconda3/bin/conda}"
STATE="$NB_HOME/.workshop"              # on the volume: the Python chosen, the set-up's lock
STATUS="$NB_HOME/workshop-setup.status"
LOG="$NB_HOME/workshop-setup.log"
say() { echo "[workshop on-create] $*"; }
now() { date -u '+%Y-%m-%d %H:%M UTC'; }

# The checkout: WORKSHOP_REPO_DIR, or the one folder under the volume that holds the workshop.
find_checkout() {
    if [ -n "${WORKSHOP_REPO_DIR:-}" ]; then
        [ -f "$WORKSHOP_REPO_DIR/workshop/__init__.py" ] && [ -f "$WORKSHOP_REPO_DIR/Makefile" ] \
            && { echo "$WORKSHOP_REPO_DIR"; return 0; }
        echo "WORKSHOP_REPO_DIR=$WORKSHOP_REPO_DIR holds no workshop checkout (workshop/__init__.py and Makefile); fix: point it at the clone, or leave it unset" >&2
        return 1
    fi
    local found=() dir
    for dir in "$NB_HOME"/*/; do
        [ -f "$dir/workshop/__init__.py" ] && [ -f "$dir/Makefile" ] && found+=("${dir%/}")
    done
    if [ ${#found[@]} -eq 1 ]; then echo "${found[0]}"; return 0; fi
    if [ ${#found[@]} -eq 0 ]; then
        echo "no workshop checkout under $NB_HOME (a folder with workshop/__init__.py and a Makefile); fix: give the notebook instance this repository as its default code repository, or set WORKSHOP_REPO_DIR" >&2
    else
        echo "more than one workshop checkout under $NB_HOME (${found[*]}); fix: set WORKSHOP_REPO_DIR to the one to set up" >&2
    fi
    return 1
}

if ! REPO="$(find_checkout)"; then
    mkdir -p "$NB_HOME" && echo "failed: no checkout to set up ($(now)); see the notebook instance's on-create log in CloudWatch" >"$STATUS" || true
    exit 1
fi
mkdir -p "$STATE"
chown "$NB_USER" "$STATE" 2>/dev/null || true

# A set-up already running (this script run twice, or on-start.sh resuming one) is left alone.
if ! flock -n "$STATE/setup.lock" true; then
    say "a set-up is already running for $REPO; its log: $LOG"
    exit 0
fi

# The set-up, in the background (as root: installing Python needs it; the rest runs as $NB_USER).
# Its variables go in the environment; the body is quoted, so nothing is expanded twice.
export NB_HOME NB_USER CONDA STATE STATUS LOG REPO
export WORKSHOP_PYTHON="${WORKSHOP_PYTHON:-}" WORKSHOP_WHEELHOUSE="${WORKSHOP_WHEELHOUSE:-}"
echo "running: the workshop's set-up started at $(now) for $REPO (its log: workshop-setup.log)" >"$STATUS"
touch "$LOG"
chown "$NB_USER" "$STATUS" "$LOG" "$STATE/setup.lock" 2>/dev/null || true
nohup setsid bash -c '
set -uo pipefail
exec 9>"$STATE/setup.lock"
# Waits a little: a check (on-start.sh, this script) holds the lock for an instant, a set-up for minutes.
flock -w 10 9 || { echo "[workshop-setup] another set-up holds $STATE/setup.lock: leaving it"; exit 0; }
log() { echo "[workshop-setup] $(date -u +%H:%M:%S) $*"; }
now() { date -u "+%Y-%m-%d %H:%M UTC"; }
as_user() {  # a command as the notebook user, in the checkout, with its own HOME
    if [ "$(id -un)" = "$NB_USER" ]; then (cd "$REPO" && "$@"); return; fi
    sudo -u "$NB_USER" -H env -u SUDO_UID -u SUDO_GID -u SUDO_USER \
        WORKSHOP_WHEELHOUSE="$WORKSHOP_WHEELHOUSE" bash -c "cd \"\$0\" && exec \"\$@\"" "$REPO" "$@"
}
is311() { [ -x "$1" ] && "$1" -c "import sys; sys.exit(sys.version_info < (3, 11))" 2>/dev/null; }
fail() { log "FAILED: $1"; echo "failed: $1 ($(now)); the end of workshop-setup.log says why" >"$STATUS"; exit 1; }
start=$(date +%s)
log "set-up of $REPO"

# Python 3.11: given, or kept from an earlier run, or installed the way the platform allows.
py="" how=""
if [ -n "$WORKSHOP_PYTHON" ]; then py="$WORKSHOP_PYTHON" how=given
elif is311 "$STATE/python311/bin/python3.11"; then py="$STATE/python311/bin/python3.11" how=conda
elif command -v dnf >/dev/null 2>&1; then
    log "dnf install python3.11 (and what the Horovod build compiles with)"
    dnf install -y -q python3.11 python3.11-devel gcc-c++ make git || fail "dnf install python3.11 failed"
    py="$(command -v python3.11)" how=dnf
elif [ -x "$CONDA" ]; then
    log "a Python 3.11 conda environment on the volume: $STATE/python311 (with $CONDA)"
    as_user "$CONDA" create -y -q -p "$STATE/python311" -c conda-forge --override-channels python=3.11 \
        || fail "conda create python=3.11 failed"
    py="$STATE/python311/bin/python3.11" how=conda
elif command -v python3.11 >/dev/null 2>&1; then py="$(command -v python3.11)" how=path
fi
is311 "$py" || fail "no Python 3.11 (found ${py:-none}); set WORKSHOP_PYTHON to one"
echo "$py $how" >"$STATE/python"
log "Python: $py ($how, $("$py" --version 2>&1))"

log "make setup PYTHON=$py"
as_user make setup PYTHON="$py" || fail "make setup failed"
log "make kernel"
as_user make kernel PYTHON="$py" || fail "make kernel (the Jupyter kernel registration) failed"
minutes=$(( ($(date +%s) - start + 59) / 60 ))
log "done in $minutes min"
echo "done: set up in $minutes min ($(now)); in a notebook, pick the kernel \"Python (distributed training workshop)\"" >"$STATUS"
' >>"$LOG" 2>&1 </dev/null &
say "the set-up runs in the background for $REPO (pid $!): its status is $STATUS, its log $LOG"
