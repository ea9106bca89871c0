"""Lab 2's specs: Horovod's ring all-reduce, one script per framework, on MNIST (see `workshop.spec`).

CPU instances on SageMaker: the workshop's Horovod wheel (built once per image) uses Gloo (see
`workshop.launchers.horovod`).
"""

from workshop.datasets.mnist import MNIST
from workshop.jobs.images import PYTORCH_IMAGE
from workshop.launchers.horovod import HorovodLauncher
from workshop.spec import Lab, SageMakerDefaults

GROUP = ("2", "2_horovod", "horovod")

LABS = [
    Lab(
        key="horovod_pytorch",
        folder="2_horovod",
        title="Horovod ring all-reduce (PyTorch)",
        strategy="ring all-reduce (Horovod, PyTorch)",
        launcher=HorovodLauncher("pytorch"),
        data=MNIST,
        entry_script="train_pytorch.py",
        local_hosts=2,
        local_procs_per_host=1,
        local_hyperparameters={"epochs": 3, "log-interval": 5},
        # `python -m workshop profile horovod_pytorch`: torch.profiler for --profile-steps steps of one epoch,
        # and Horovod's timeline of them (the TensorFlow script has no --profile-steps)
        profile_flag="profile-steps",
        profile_hyperparameters={"epochs": 1},
        sagemaker=SageMakerDefaults(**PYTORCH_IMAGE, instance_type="ml.c5.2xlarge", instance_count=2, procs_per_host=1),
        aliases=("2_horovod_pytorch", "hvd-pytorch", "horovod-pytorch"),
        group_aliases=GROUP,
    ),
    Lab(
        key="horovod_tensorflow",
        folder="2_horovod",
        title="Horovod ring all-reduce (TensorFlow)",
        strategy="ring all-reduce (Horovod, TensorFlow)",
        launcher=HorovodLauncher("tensorflow"),
        data=MNIST,
        entry_script="train_tensorflow.py",
        local_hosts=2,
        local_procs_per_host=1,
        local_hyperparameters={"epochs": 3, "log-interval": 5},
        sagemaker=SageMakerDefaults(
            framework="tensorflow",
            framework_version="2.21",
            py_version="py312",
            instance_type="ml.c5.2xlarge",
            instance_count=2,
            procs_per_host=1,
        ),
        aliases=("2_horovod_tensorflow", "hvd-tensorflow", "horovod-tensorflow"),
        group_aliases=GROUP,
    ),
]
