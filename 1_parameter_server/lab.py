"""Lab 1's spec: TensorFlow 2's ParameterServerStrategy on MNIST (see `workshop.spec`)."""

from workshop.datasets.mnist import MNIST
from workshop.launchers.parameter_server import ParameterServerLauncher
from workshop.spec import Lab, SageMakerDefaults

LAB = Lab(
    key="parameter_server",
    folder="1_parameter_server",
    title="Parameter server (TensorFlow 2 ParameterServerStrategy)",
    strategy="asynchronous parameter server",
    launcher=ParameterServerLauncher(),
    data=MNIST,
    local_hosts=3,  # 3 parameter servers, the coordinator, 2 workers: 6 TF processes
    local_procs_per_host=1,
    local_hyperparameters={"steps": 300, "log-interval": 50},
    metrics=("train_loss", "test_loss", "test_accuracy", "steps_per_sec", "final_test_accuracy"),
    sagemaker=SageMakerDefaults(
        framework="tensorflow",
        framework_version="2.21",
        py_version="py312",
        instance_type="ml.c5.2xlarge",
        instance_count=3,
        procs_per_host=1,
    ),
    aliases=("1", "1_parameter_server", "ps"),
)
