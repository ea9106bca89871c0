"""Run a SageMaker SDK v3 container driver unchanged, on a simulated host.

    python -m workshop.run_driver /path/to/distributed_drivers/torchrun_driver.py

On SageMaker, `sm_train.sh` runs the driver of the job's `distributed=` config (SDK's
`Torchrun`, or a workshop-owned `DistributedConfig`) after exporting the `SM_*` variables.
The local cluster does the same with this wrapper, which changes exactly two things:

1. The SDK's drivers write the failure file to the hard-coded `/opt/ml/output/failure`
   (`container_drivers/common/utils.py: FAILURE_FILE`). Here it goes to `SM_OUTPUT_FAILURE`,
   inside the host's sandbox.
2. The local cluster stops a host by signalling its process group. A SIGTERM that reaches
   only this process (the parent died and the kernel sent PR_SET_PDEATHSIG) is forwarded to
   the whole group, so the launcher the driver started (torchrun, mpirun) shuts its workers
   down instead of being orphaned.

Everything else, including the command line the driver builds, is the SDK's own code.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from pathlib import Path


def _forward_sigterm(signum, frame):  # noqa: ARG001
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        os.killpg(os.getpgrp(), signal.SIGTERM)
    finally:
        sys.exit(128 + signum)


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit("usage: python -m workshop.run_driver DRIVER_SCRIPT")
    driver = Path(argv[0]).resolve()
    signal.signal(signal.SIGTERM, _forward_sigterm)
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
