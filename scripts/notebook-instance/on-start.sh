#!/bin/bash
# SageMaker notebook instance, on-start (every start, as root, stopped after 5 minutes): register
# the workshop's kernel again (a stop/start resets everything but the ML storage volume).
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
[ -n "$REPO" ] && [ -x "$REPO/.venv/bin/python" ] || exit 0
as_user() {
  if [ "$(id -un)" = "$NB_USER" ]; then "$@"; else sudo -u "$NB_USER" -H "$@"; fi
}
as_user nohup "$REPO/.venv/bin/python" -m ipykernel install --user --name distributed-training-workshop \
  --display-name "Python (distributed training workshop)" >>"$NB_HOME/workshop-setup.log" 2>&1 </dev/null &
