"""JupyterLab's status bar says "Busy" for as long as a training cell runs.

The issue: it said "Idle" while a long cell ran in 4 of the 6 notebooks (lab 1's run cell, lab 2's
TensorFlow training, job parallelism's search, fault tolerance's first run). Their progress displays were
tqdm's widget; the first widget a kernel shows makes JupyterLab's widget manager ask the kernel for a
subshell (`create_subshell_request`, on the control channel), which the kernel answers at once between a
"busy" and an "idle" status, and JupyterLab shows the last status it received, whichever request it
answers (jupyterlab/jupyterlab#10701). The displays are now outputs redrawn in place, not widgets
(`workshop.runtime.progress.LiveLine`).

The test is the front end: it runs a cell that trains with the workshop's run machinery (a local job's
display, `still`, a search's display) in a real kernel of this interpreter, answers a widget as
JupyterLab does, and reads every status the kernel publishes until the cell ends.
"""

from __future__ import annotations

import pytest

CELL = """
import time
from workshop.labs import get_lab
from workshop.runner import run_local
from workshop.runtime.progress import still
from workshop.search import Objective
from workshop.tuning import SearchProgress, Trial

with still("waiting for nothing"):
    time.sleep(1.5)
result = run_local(get_lab("data_parallel"), hosts=1, hyperparameters={{"epochs": 1}},
                   data_dir={data_dir!r}, runs_dir={runs_dir!r})
assert result.ok, result.failure
search = SearchProgress(2, Objective.parse(get_lab("data_parallel"), None))
search.update([(Trial(1, {{"lr": "0.1"}}), time.monotonic())], [])
search.close()
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_kernel_running_a_training_cell_says_busy_until_the_cell_ends(tmp_path, mnist_dir, kernel):
    km, kc = kernel()
    msg_id = kc.execute(CELL.format(data_dir=str(mnist_dir), runs_dir=str(tmp_path / "runs")))
    statuses, kinds, errors, asked_subshell = [], [], [], False
    while True:
        msg = kc.get_iopub_msg(timeout=300)
        kind, content, parent = msg["header"]["msg_type"], msg["content"], msg["parent_header"]
        kinds.append(kind)
        if kind == "status" and (statuses or parent.get("msg_id") == msg_id):  # from the cell's start
            statuses.append((content["execution_state"], parent.get("msg_type")))
            if parent.get("msg_id") == msg_id and content["execution_state"] == "idle":
                break
        elif kind == "error":
            errors.append("\n".join(content["traceback"]))
        elif kind == "comm_open" and content.get("target_name") == "jupyter.widget" and not asked_subshell:
            # JupyterLab's widget manager, on the first widget: a subshell for the widgets' messages
            kc.control_channel.send(kc.session.msg("create_subshell_request", {}))
            asked_subshell = True
    assert not errors, errors[0]
    # From the cell's start to its end, the kernel said "busy" once and "idle" only at the end.
    assert statuses == [("busy", "execute_request"), ("idle", "execute_request")], statuses
    assert "comm_open" not in kinds  # no widget: the displays are outputs ...
    assert "display_data" in kinds and "update_display_data" in kinds  # ... redrawn in place
