"""Launchers: how a lab's processes start, in one place for both runtimes.

Each gives the local cluster and the SageMaker job the same SDK v3 `DistributedConfig`, plus
whatever else a job needs (offline checks, input channels, set-up jobs): see `workshop.spec.Launcher`.

- `torchrun`: SDK v3's `Torchrun` (labs 3 and 4; with SMP settings on lab 4's SMP route);
- `parameter_server`: the workshop's TF2 parameter-server driver (lab 1);
- `horovod`: the workshop's Horovod driver and its wheel store (lab 2); `horovod_probe`: lab 2's
  build check and all-reduce measurement;
- `basic`: no launcher, SDK v3's basic script driver: the entry once per host (a script of your own).
"""
