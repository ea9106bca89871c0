"""--profile-steps: torch.profiler on every rank, one Chrome/Perfetto trace per rank (workshop.profiling).

A module beside train.py in the job's code/ folder; its definitions are copies of labs 2 and 3's
(tests/test_copies.py keeps them identical).
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

# Shared copy: keep identical in every script that has it (tests/test_copies.py).
PROFILE_WAIT, PROFILE_WARMUP = 2, 2


# Shared copy: keep identical in every script that has it (tests/test_copies.py).
class StepProfiler:
    """--profile-steps S: torch.profiler on this rank for S training steps, after PROFILE_WAIT steps
    unrecorded and PROFILE_WARMUP recorded but dropped (torch.profiler.schedule), written as one
    Chrome/Perfetto trace, `<output_dir>/profile/trace-rank<R>.json` (SM_OUTPUT_DATA_DIR: SageMaker
    uploads it with the job's output). Each step is one `ProfilerStep#N` span in the trace. Off
    (S = 0): every call does nothing. `seconds` and `samples`: the time and samples of the steps it
    was on (profiling slows them), which the epoch's throughput leaves out.

    The trace's `workshop` entry adds what torch.profiler does not record: the training thread's CPU
    seconds in each step (`time.thread_time`: on a CPU, not waiting or descheduled), the CPUs this
    process may use and the machine it ran on (the kernel's boot id: ranks on one machine share its
    CPUs), from which the report tells communication from time-sharing when ranks outnumber cores."""

    def __init__(self, steps: int, output_dir: str, rank: int):
        self.steps, self.rank, self.prof, self.taken = steps, rank, None, 0
        self.path = Path(output_dir) / "profile" / f"trace-rank{rank}.json"
        self.seconds, self.samples, self.epoch, self.t0 = 0.0, 0, None, 0.0
        self.cpu_s: dict[int, float] = {}  # ProfilerStep number -> the training thread's CPU seconds in it
        self.cpu0 = 0.0

    def start(self, epoch: int) -> None:
        if not self.steps or self.epoch is not None:
            return
        from torch.profiler import ProfilerActivity, profile, schedule

        self.path.parent.mkdir(parents=True, exist_ok=True)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.prof = profile(
            activities=activities,
            schedule=schedule(wait=PROFILE_WAIT, warmup=PROFILE_WARMUP, active=self.steps, repeat=1),
            record_shapes=True,  # the collectives' tensor sizes: the bytes each step moves
            on_trace_ready=lambda prof: prof.export_chrome_trace(str(self.path)),
        )
        self.epoch, self.t0 = epoch, time.perf_counter()
        self.prof.start()
        self.cpu0 = time.thread_time()

    def step(self, samples: int) -> None:
        """After each training step (the optimizer's): the end of one ProfilerStep."""
        if self.prof is None:
            return
        now = time.thread_time()
        self.cpu_s[self.taken], self.cpu0 = now - self.cpu0, now
        self.samples += samples
        self.taken += 1
        if self.taken == PROFILE_WAIT + PROFILE_WARMUP + self.steps:  # the trace is written at this prof.step()
            try:
                machine = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
            except OSError:
                machine = platform.node()
            cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
                list(range(os.cpu_count() or 1))
            self.prof.add_metadata_json("workshop", json.dumps(
                {"step_cpu_s": self.cpu_s, "cpus": cpus, "machine": machine}))
        self.prof.step()
        if self.taken >= PROFILE_WAIT + PROFILE_WARMUP + self.steps:  # the trace is written: stop
            self.stop()

    def stop(self) -> None:
        if self.prof is None:
            return
        self.prof.stop()
        self.prof, self.seconds = None, time.perf_counter() - self.t0
        if self.rank == 0:
            print(f"Profiled {max(0, self.taken - PROFILE_WAIT - PROFILE_WARMUP)} steps on every rank; "
                  f"traces in {self.path.parent}.", flush=True)
