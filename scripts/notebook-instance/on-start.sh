#!/bin/bash
# SageMaker notebook instance, lifecycle configuration "on-start" (every start, the first one
# included): puts back what a stop/start loses, within seconds.
#
# A stop/start keeps only the ML storage volume (/home/ec2-user/SageMaker), where on-create.sh set
# the workshop up (the checkout and its .venv); it resets the root volume, and with it the Jupyter
# kernel registration under ~/.local/share/jupyter and, on AL2023, the python3.11 package the
# environment runs on (docs.aws.amazon.com/sagemaker/latest/dg/nbi-add-external.html: custom
# environments on the volume, an on-start script to register them again). So:
#   1. python3.11 again, when on-create.sh installed it with dnf (seconds);
#   2. the kernel registered again (`make kernel`), when the set-up is complete;
#   3. otherwise the set-up resumed in the background (a stop during the set-up, or a set-up that
#      failed): on-create.sh from the checkout, with the same log and status
#      (workshop-setup.log, workshop-setup.status on the volume). At creation, SageMaker runs this
#      script right after on-create.sh, whose set-up is then still running: nothing to do.
# The jupyter-server is not restarted: it reads the kernel folders again whenever JupyterLab lists
# kernels, and a restart would stop the kernels of someone already at work.
#
# Settings: the same as on-create.sh (WORKSHOP_NB_HOME, WORKSHOP_NB_USER, WORKSHOP_REPO_DIR,
# WORKSHOP_WHEELHOUSE, WORKSHOP_PYTHON, WORKSHOP_CONDA).
set -euo pipefail

NB_HOME="${WORKSHOP_NB_HOME:-/home/ec2-user/SageMaker}"
NB_USER="${WORKSHOP_NB_USER:-ec2-user}"
STATE="$NB_HOME/.workshop"
STATUS="$NB_HOME/workshop-setup.status"
say() { echo "[workshop on-start] $*"; }
now() { date -u '+%Y-%m-%d %H:%M UTC'; }

# The checkout: as on-create.sh finds it.
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
as_user() {  # a command as the notebook user, in the checkout, with its own HOME
    if [ "$(id -un)" = "$NB_USER" ]; then (cd "$REPO" && "$@"); return; fi
    sudo -u "$NB_USER" -H env -u SUDO_UID -u SUDO_GID -u SUDO_USER \
        bash -c 'cd "$0" && exec "$@"' "$REPO" "$@"
}

if ! REPO="$(find_checkout)"; then
    mkdir -p "$NB_HOME" && echo "failed: no checkout to set up ($(now)); see the notebook instance's on-start log in CloudWatch" >"$STATUS" || true
    exit 1
fi

# 1. The Python on-create.sh chose ("<path> <how>"): a dnf package is gone after a restart.
py="" how=""
[ -f "$STATE/python" ] && read -r py how <"$STATE/python" || true
if [ "$how" = dnf ] && [ ! -x "$py" ]; then
    say "python3.11 (root volume, reset by the restart): dnf install python3.11"
    timeout 180 dnf install -y -q python3.11 python3.11-devel gcc-c++ make \
        || say "dnf install python3.11 failed: the kernel cannot start until it is installed"
fi

# 2. The set-up complete (the Makefile's stamp of it up to date; `make -q setup` would say no whenever
#    `setup` has a recipe of its own): register the kernel again.
if [ -n "$py" ] && as_user make -q .venv/.setup-done PYTHON="$py" >/dev/null 2>&1; then
    if as_user timeout 120 make --no-print-directory kernel PYTHON="$py"; then
        echo "done: set up; the kernel \"Python (distributed training workshop)\" registered again at start ($(now))" >"$STATUS"
        say "kernel registered again for $REPO"
        exit 0
    fi
    echo "failed: the kernel registration at start failed ($(now)); run 'make kernel' in a terminal, in $REPO" >"$STATUS"
    exit 1
fi

# 3. Not complete: a set-up running now (on-create's, at creation) is left alone; else resume it.
if [ -d "$STATE" ] && ! flock -n "$STATE/setup.lock" true; then
    say "the set-up is still running (at creation, on-create.sh started it): see $STATUS"
    exit 0
fi
say "the set-up of $REPO is not complete: resuming it in the background"
WORKSHOP_REPO_DIR="$REPO" exec bash "$REPO/scripts/notebook-instance/on-create.sh"
