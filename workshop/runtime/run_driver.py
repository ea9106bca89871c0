"""Run a SageMaker SDK v3 container driver unchanged, on a simulated host.

    python -m workshop.runtime.run_driver /path/to/distributed_drivers/torchrun_driver.py

On SageMaker, `sm_train.sh` runs the driver of the job's `distributed=` config (SDK's
`Torchrun`, or a workshop-owned `DistributedConfig`) after exporting the `SM_*` variables.
The local cluster does the same with this wrapper, which changes exactly two things:

1. The SDK's drivers write the failure file to the hard-coded `/opt/ml/output/failure`
   (`container_drivers/common/utils.py: FAILURE_FILE`). Here it goes to `SM_OUTPUT_FAILURE`,
   inside the host's sandbox.
2. The local cluster stops a host by signalling its process group. A SIGTERM that reaches
   only this process (the parent died and the kernel sent PR_SET_PDEATHSIG, which this process
   asks for first thing: `hostns.die_with_parent_from_start`) is forwarded to
   the whole group, so the launcher the driver started (torchrun, mpirun) shuts its workers
   down instead of being orphaned. Launchers start their workers in sessions of their own, and
   one signalled while it is still starting them may not know them yet (torchrun, between
   starting its workers and recording them). When the local cluster itself died, so that
   nobody else will sweep, the driver then waits a few seconds and kills whatever still
   carries this run's marker variable.

Everything else, including the command line the driver builds, is the SDK's own code.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from pathlib import Path

from workshop.runtime.hostns import die_with_parent_from_start
from workshop.runtime.processes import forward_sigterm


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit("usage: python -m workshop.runtime.run_driver DRIVER_SCRIPT")
    driver = Path(argv[0]).resolve()
    signal.signal(signal.SIGTERM, forward_sigterm)
    die_with_parent_from_start(signal.SIGTERM)  # as the local cluster's preexec_fn once did
    drivers_root = driver.parent.parent  # the drivers import `common.utils` from here
    sys.path.insert(0, str(drivers_root))
    failure_file = os.environ.get("SM_OUTPUT_FAILURE")
    if failure_file and (drivers_root / "common" / "utils.py").is_file():
        import common.utils  # the SDK's module, as the driver itself imports it

        common.utils.FAILURE_FILE = failure_file
    sys.argv = [str(driver)]
    runpy.run_path(str(driver), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
