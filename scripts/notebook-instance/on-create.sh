#!/bin/bash
# SageMaker notebook instance, on-create (runs once, as root, stopped after 5 minutes): start the
# workshop's set-up in the background as the notebook user and return at once.
# Provisional version (helper "event"); the interface is /work/wt/_notes/NOTEBOOK_INTERFACE.md.
set -euo pipefail
NB_HOME="${WORKSHOP_NB_HOME:-/home/ec2-user/SageMaker}"
NB_USER="${WORKSHOP_NB_USER:-ec2-user}"
REPO="${WORKSHOP_REPO_DIR:-}"
if [ -z "$REPO" ]; then
  for dir in "$NB_HOME"/*/; do
    if [ -f "$dir/workshop/__init__.py" ] && [ -f "$dir/Makefile" ]; then REPO="${dir%/}"; break; fi
  done
fi
LOG="$NB_HOME/workshop-setup.log"
if [ -z "$REPO" ]; then
  echo "workshop: no checkout under $NB_HOME (a folder with workshop/__init__.py and Makefile)" >>"$LOG"
  exit 0
fi
as_user() {
  if [ "$(id -un)" = "$NB_USER" ]; then "$@"; else sudo -u "$NB_USER" -H "$@"; fi
}
as_user env WORKSHOP_WHEELHOUSE="${WORKSHOP_WHEELHOUSE:-}" \
  nohup bash -c "cd '$REPO' && make setup" >>"$LOG" 2>&1 </dev/null &
echo "workshop: set-up started in the background; its log: $LOG"
