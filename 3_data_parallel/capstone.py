"""What your_script.ipynb does with the `prepare()` the learner writes: check it on two real ranks (gloo, tiny
data), and put it into a copy of the ordinary script in your_script/, which then runs unchanged otherwise.

The learner's function replaces the script's own `prepare(model, train_set, batch_size)`, the one place where the
model and the data meet; the imports it may use (`IMPORTS`) go in above it, marked, as lab 3's `# DDP:` lines are.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ORIGINAL = HERE / "your_script" / "train.py"
# What the learner's prepare() may use without importing it: the same lines in the check and in the script.
IMPORTS = (
    "import torch.distributed as dist\n"
    "from torch.nn.parallel import DistributedDataParallel as DDP\n"
    "from torch.utils.data import DataLoader, DistributedSampler\n"
)
CHECK_TIMEOUT_S = 180

# Two ranks on this machine, as torchrun starts them: each calls prepare() on the same 16 samples, takes every
# batch of its loader, and steps once per batch; then says what it saw and the weights it ended with.
_HARNESS = """
import json, os
import torch
from torch.utils.data import TensorDataset
{imports}
{source}

torch.manual_seed(0)
torch.set_num_threads(1)
net = torch.nn.Linear(1, 1)
xs = torch.arange(16, dtype=torch.float32).unsqueeze(1)
model, loader = prepare(net, TensorDataset(xs, 0.5 * xs), 4)
joined = dist.is_available() and dist.is_initialized()
seen = []
optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
for x, y in loader:
    seen += [int(v) for v in x.flatten().tolist()]
    optimizer.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    optimizer.step()
print("RESULT " + json.dumps({{"joined": joined, "world": dist.get_world_size() if joined else 1,
                              "seen": sorted(seen), "weights": [p.item() for p in net.parameters()]}}), flush=True)
if joined:
    dist.destroy_process_group()
"""


def function_source(function: Any) -> str:
    """The source of the learner's function, as written in its cell (or the solution file)."""
    return textwrap.dedent(inspect.getsource(function))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(prepare: Any) -> list[dict[str, Any]]:
    """Run `prepare` on 2 ranks (gloo, loopback); each rank's report, or a RuntimeError saying how one failed."""
    with tempfile.TemporaryDirectory(prefix="workshop-prepare-check-") as tmp:
        script = Path(tmp) / "check_prepare.py"
        script.write_text(_HARNESS.format(imports=IMPORTS, source=function_source(prepare)))
        port = _free_port()
        procs = []
        for rank in range(2):
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                   "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "OMP_NUM_THREADS": "1"}
            procs.append(subprocess.Popen([sys.executable, str(script)], cwd=tmp, env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        outs = []
        try:
            for proc in procs:
                outs.append(proc.communicate(timeout=CHECK_TIMEOUT_S)[0])
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the two ranks did not finish in {CHECK_TIMEOUT_S} s: one waits for the other "
                               "(does every rank call the same collectives?)") from None
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    reports = []
    for rank, (proc, out) in enumerate(zip(procs, outs, strict=True)):
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            last = [line for line in out.splitlines() if line.strip()][-1:] or [f"exit status {proc.returncode}"]
            raise RuntimeError(f"rank {rank} failed: {last[0].strip()}")
        reports.append(json.loads(lines[-1][len("RESULT "):]))
    return reports


def judge_prepare(answer: Any, reference: Any, context: Any) -> str | None:
    """The exercise's judge: what is wrong with the learner's prepare() on two ranks, or None when it is right."""
    if not callable(answer):
        return f"prepare should be a function, got {type(answer).__name__}"
    reports = run_two_ranks(answer)
    if not all(r["joined"] and r["world"] == 2 for r in reports):
        return ("the two processes never joined one job: after prepare(), dist.is_initialized() is False (each "
                "trained alone, on everything)")
    seen = [r["seen"] for r in reports]
    if set(seen[0]) & set(seen[1]) or sorted(seen[0] + seen[1]) != list(range(16)):
        return (f"the ranks did not split the data: of 16 samples rank 0 trained on {len(seen[0])} and rank 1 on "
                f"{len(seen[1])}, {len(set(seen[0]) & set(seen[1]))} of them the same ones")
    if any(abs(a - b) > 1e-6 for a, b in zip(reports[0]["weights"], reports[1]["weights"], strict=True)):
        return ("after the same number of steps the two ranks' weights differ: each applied the gradient of its "
                "own samples only, so the copies drifted apart")
    return None


def data_parallel_script(prepare: Any, dest: Path) -> Path:
    """The ordinary script with the learner's `prepare` in place of its own (and `IMPORTS` above it), written as
    `dest/train.py`; every other line as it was. Returns the folder (the job's source_dir)."""
    source = ORIGINAL.read_text(encoding="utf-8")
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "prepare")
    lines = source.splitlines(keepends=True)
    yours = ("# DDP: the imports and the prepare() written in your_script.ipynb\n" + IMPORTS + "\n\n"
             + function_source(prepare).rstrip() + "\n")
    written = "".join(lines[: node.lineno - 1]) + yours + "".join(lines[node.end_lineno:])
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "train.py").write_text(written, encoding="utf-8")
    return dest


def diff(folder: Path) -> str:
    """What changed from the ordinary script to the data-parallel one, as a unified diff."""
    return "".join(difflib.unified_diff(ORIGINAL.read_text().splitlines(keepends=True),
                                        (folder / "train.py").read_text().splitlines(keepends=True),
                                        "your_script/train.py", "data parallel/train.py", n=1))


def without_sampler(model, train_set, batch_size):
    """A plausible wrong answer (the tests'): the ranks join and the model is wrapped, but the data is not split."""
    dist.init_process_group("gloo")  # noqa: F821 - IMPORTS, in the harness
    return DDP(model), DataLoader(train_set, batch_size=batch_size, shuffle=True)  # noqa: F821
