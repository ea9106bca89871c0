"""How long the command line takes to answer what needs no training: --help, `labs`, bad input.

    python benchmarks/bench_cli.py [--repeats 7] [--out-dir images/]

Each command runs in a fresh interpreter (`python -m workshop ...`), as a person types it, `--repeats`
times, interleaved with `python -c pass` (the interpreter's own start) so that the machine's load falls
on all alike. The table gives the best and the median wall time of each, and the best less the
interpreter's best: what the workshop itself costs. The target: every one under a second.

These answer without importing the SageMaker SDK, boto3, torch or TensorFlow (a fast test checks the
imports: tests/test_architecture.py); before that, importing the SDK alone took 4-12 s here.
A second table times what a command that does submit, and a notebook's first SageMaker cell, pays: the SDK's
import, alone and through the workshop (which keeps jsonschema from building rfc3987_syntax's parser:
workshop/__init__.py).
Output: the table on stdout and `bench_cli.md` in `--out-dir`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import load_average  # noqa: E402

COMMANDS = {
    "python -c pass": ["-c", "pass"],
    "--help": ["-m", "workshop", "--help"],
    "labs": ["-m", "workshop", "labs"],
    "run nosuchlab": ["-m", "workshop", "run", "nosuchlab"],
    "run data_parallel --hosts 0": ["-m", "workshop", "run", "data_parallel", "--hosts", "0"],
    "run data_parallel --dry-run (local: refused)": ["-m", "workshop", "run", "data_parallel", "--dry-run"],
    "tune data_parallel --param lr=abc": ["-m", "workshop", "tune", "data_parallel", "--param", "lr=abc"],
    "run data_parallel --hp lr=abc": ["-m", "workshop", "run", "data_parallel", "--hp", "lr=abc"],
}
TARGET_S = 1.0
SDK_IMPORTS = {
    "the SDK alone": ["-c", "from sagemaker.train import ModelTrainer"],
    "the SDK through the workshop": ["-c", "import workshop; from sagemaker.train import ModelTrainer"],
}


def time_once(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t0


def time_interleaved(commands: dict[str, list[str]], repeats: int) -> dict[str, list[float]]:
    """Each command's wall times over `repeats` rounds, one run of every command per round (the load
    of the moment falls on all alike)."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, cmd in commands.items():
            times[name].append(time_once(cmd))
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="runs of each command, interleaved")
    parser.add_argument("--sdk-repeats", type=int, default=3, help="runs of each SDK import, interleaved")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "images", help="where bench_cli.md goes")
    args = parser.parse_args(argv)
    before = load_average()
    times = time_interleaved(COMMANDS, args.repeats)
    base = min(times["python -c pass"])
    lines = [f"CLI answers, best and median of {args.repeats} interleaved runs; load average {before} before, "
             f"{load_average()} after.", "",
             "| command | best | median | best less `python -c pass` | under 1 s |", "|---|---:|---:|---:|---|"]
    for name, values in times.items():
        best = min(values)
        ok = "-" if name == "python -c pass" else ("yes" if best < TARGET_S else "NO")
        lines.append(f"| `{name}` | {best:.2f} s | {statistics.median(values):.2f} s | {best - base:+.2f} s | {ok} |")
    sdk = time_interleaved(SDK_IMPORTS, args.sdk_repeats)
    alone = min(sdk["the SDK alone"])
    lines += ["", f"Importing the SageMaker SDK (`from sagemaker.train import ModelTrainer`), best and median of "
              f"{args.sdk_repeats}:", "", "| import | best | median | vs alone |", "|---|---:|---:|---:|"]
    for name, values in sdk.items():
        lines.append(f"| {name} | {min(values):.2f} s | {statistics.median(values):.2f} s | {min(values) / alone:.2f} x |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "bench_cli.md").write_text(text)
    return 0 if all(min(v) < TARGET_S for k, v in times.items() if k != "python -c pass") else 1


if __name__ == "__main__":
    sys.exit(main())
