"""Lab 3's spec: PyTorch DDP on MNIST under SDK v3's Torchrun (see `workshop.spec`)."""

from workshop.datasets.mnist import MNIST
from workshop.jobs.images import PYTORCH_IMAGE
from workshop.launchers.torchrun import TorchrunLauncher
from workshop.spec import Lab, NotebookJobs, SageMakerDefaults

LAB = Lab(
    key="data_parallel",
    folder="3_data_parallel",
    title="Data parallel (PyTorch DDP)",
    strategy="synchronous all-reduce (DDP)",
    launcher=TorchrunLauncher(),
    data=MNIST,
    local_hosts=2,
    local_procs_per_host=1,
    # log-interval 5: a few points per epoch on the 4,000-digit subset, for the plots;
    # checkpoint-every 20: a rank killed mid-epoch (--fault, --max-restarts) costs at most 19 steps,
    # not the epoch so far (a checkpoint of this CNN takes milliseconds)
    local_hyperparameters={"epochs": 3, "log-interval": 5, "checkpoint-every": 20},
    # `python -m workshop profile data_parallel`: torch.profiler for --profile-steps steps of one epoch,
    # with no mid-epoch checkpoint inside the profiled steps
    profile_flag="profile-steps",
    profile_hyperparameters={"epochs": 1, "checkpoint-every": 0},
    sagemaker=SageMakerDefaults(**PYTORCH_IMAGE, instance_type="ml.g5.xlarge", instance_count=2),
    # In sagemaker mode: the lab's job; fault tolerance's rank-kill job and spot job; the search at
    # world sizes 1 and 2, 6 learning rates each, 2 trials at once (tests/test_event.py checks the
    # notebooks' parameters cells against these).
    notebook_jobs=(
        NotebookJobs("data_parallel.ipynb", instance_count=2, max_run_s=3600),
        NotebookJobs("fault_tolerance.ipynb", instance_count=2, max_run_s=1800),
        NotebookJobs("fault_tolerance.ipynb", instance_count=2, max_run_s=1800, spot=True),
        NotebookJobs("job_parallelism.ipynb", instance_count=1, max_run_s=1800, jobs=6, parallel=2),
        NotebookJobs("job_parallelism.ipynb", instance_count=2, max_run_s=1800, jobs=6, parallel=2),
    ),
    aliases=("3", "3_data_parallel", "ddp"),
)
