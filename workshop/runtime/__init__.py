"""The local runtime: SageMaker's training contract, simulated on this machine. It knows no lab and no AWS.

- `contract`: the container's contract (`/opt/ml`, `SM_*`, `sm_drivers`), a host's sandbox.
- `local_cluster`: N simulated hosts running the SDK's own `sm_train.sh` (or its driver), their logs: `LocalCluster`,
  its public face. Behind it: `results` (what a run produced), `machine` (what this machine can give a run,
  checked before it starts), `hosts` (each host laid out: sandbox, environment, command), `supervisor` (the
  hosts started, read and stopped), `streams` (their output as lines per rank), `stalls` (the stall watch) and
  `failures` (the failure report).
- `hostns`: Linux namespaces that give each host `/opt/ml`, its peers as `algo-1..N`, a hostname that is
  not `algo-N` (as SageMaker does not promise one) and a private network.
- `run_driver`: the process runtime's entry, which runs one SDK driver script.
- `processes`: how every process of one run is found (and swept) by its marker; Ctrl-C held back
  where it would cut a process start or a run's shutdown in half.
- `netcounters`: the kernel's loopback byte counters, for measuring traffic.
- `folders`: one job per folder (run and search folders made under unique names, a lock on a folder
  a job is using) and a full disk said in one line.
- `artifacts`: what a job leaves, as SageMaker lays it out: every host's model (and output data) folder in
  one `model.tar.gz` (`output.tar.gz`), a name two hosts wrote named.
"""
