"""--profile-steps for the PyTorch script: torch.profiler's trace of a few steps on every rank, and
Horovod's own timeline of the same steps (workshop.profiling reads both). Off by default."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

from contract import PROFILE_WAIT, PROFILE_WARMUP


def allow_timeline(profile_steps: int) -> None:
    """Before hvd.init(): hvd.start_timeline (HorovodProfile) works later only when this is set by then."""
    if profile_steps:
        os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC")


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


class HorovodProfile:
    """--profile-steps S, Horovod's part: while StepProfiler records its S steps, Horovod's own timeline
    of them, `<output_dir>/profile/horovod-timeline.json` (rank 0 writes it; open it in
    https://ui.perfetto.dev), and this rank and the world's size in the torch trace (as
    torch.distributed's runs have them), which the report needs. Horovod all-reduces on its own
    background thread, which torch.profiler does not record; the timeline shows each gradient's
    NEGOTIATE_ALLREDUCE and ALLREDUCE there. (hvd.start_timeline needs HOROVOD_TIMELINE=DYNAMIC
    before hvd.init(): main sets it, with allow_timeline, when profiling.)"""

    def __init__(self, hvd, profiler: StepProfiler):
        self.hvd, self.profiler, self.on = hvd, profiler, False
        self.path = profiler.path.with_name("horovod-timeline.json")

    def follow(self) -> None:
        """After each profiler.step() (and its stop()): start with its recorded steps, stop with it."""
        recording = self.profiler.prof is not None and self.profiler.taken >= PROFILE_WAIT + PROFILE_WARMUP
        if recording and not self.on:
            hvd = self.hvd
            controller = "gloo" if hvd.gloo_enabled() else "mpi"
            self.profiler.prof.add_metadata_json("distributedInfo", json.dumps(
                {"backend": f"horovod/{controller}", "rank": hvd.rank(), "world_size": hvd.size()}))
            hvd.start_timeline(str(self.path))  # every rank calls it; rank 0 writes the file
            self.on = True
        elif self.on and self.profiler.prof is None:
            self.hvd.stop_timeline()
            self.on = False
