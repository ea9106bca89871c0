"""Entry script of lab 2's one-host *build job*: build Horovod once for a training image.

    python hvd_build.py --frameworks pytorch      # on one instance of the lab's training image

`workshop.launchers.horovod` starts this as a SageMaker training job (SDK v3's basic script driver, one
instance, the very image the lab's jobs use) when its S3 store has no wheel for that image and
Horovod version yet. It leaves in SM_MODEL_DIR (uploaded as `model.tar.gz`):

- `wheels/horovod-<version>-<python tag>-...whl`: Horovod built by `build_horovod.sh` (this
  folder; the set-up's patched build, CPU collectives over Gloo, no MPI, no NCCL);
- `wheels/<dependency>.whl` for each of Horovod's runtime dependencies (cloudpickle, psutil,
  pyyaml, packaging, cffi) that the image lacks, with their own dependencies, so that a
  training host installs with `pip install --no-index --find-links` and never needs PyPI;
- `horovod-build.json`: what was built, for which Python and framework versions, whether NCCL
  is in it, how long it took, and whether it was compiled or taken from a cached wheel.

Before it writes the record it checks what a training host will do: `pip install --dry-run
--no-index --find-links wheels horovod==<version>` resolves in this image, and the wheel,
unpacked alone into a scratch folder, imports the framework's extension here.

`workshop.launchers.horovod` then copies the wheels to the user's S3 prefix, keyed by image URI and
Horovod version, where every later job finds them (channel `horovod`). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build_horovod.sh"
# Shared copy: keep identical in every script that has it (tests/test_copies.py).
HOROVOD_VERSION = "0.28.1"
RECORD = "horovod-build.json"
EXTENSIONS = {"pytorch": ("horovod.torch", "torch"), "tensorflow": ("horovod.tensorflow", "tensorflow")}


def log(message: str) -> None:
    print(f"[hvd_build] {message}", flush=True)


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    log("running " + " ".join(cmd))
    return subprocess.run(cmd, text=True, **kwargs)


def runtime_requirements(wheel: Path) -> list[str]:
    """The wheel's unconditional Requires-Dist lines (no extras, no markers that exclude this Python)."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    out = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement, _, marker = line[len("Requires-Dist:"):].strip().partition(";")
        if "extra ==" in marker:
            continue
        if "python_version" in marker and "< \"3.7\"" in marker:  # dataclasses backport
            continue
        out.append(requirement.strip())
    return out


def missing_here(requirements: list[str]) -> list[str]:
    """The requirements whose distribution is not installed in this image."""
    missing = []
    for requirement in requirements:
        name = re.split(r"[<>=!~ \[(]", requirement, maxsplit=1)[0]
        try:
            version(name)
        except PackageNotFoundError:
            missing.append(requirement)
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frameworks", default="", help="pytorch and/or tensorflow (default: what imports here)")
    parser.add_argument("--out", default=os.environ.get("SM_MODEL_DIR", "/opt/ml/model"))
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    out = Path(args.out)
    wheels = out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    python = sys.executable

    cmd = ["bash", str(BUILD_SCRIPT), "--python", python, "--wheel-dir", str(wheels)]
    if args.frameworks:
        cmd += ["--frameworks", args.frameworks]
    build = run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    sys.stdout.write(build.stdout)
    if build.returncode != 0:
        log(f"ERROR: build_horovod.sh failed with status {build.returncode}")
        return 1
    source = next((ln.split("source: ", 1)[1] for ln in build.stdout.splitlines() if "] source: " in ln), "unknown")
    built = sorted(wheels.glob(f"horovod-{HOROVOD_VERSION}-*.whl"))
    if len(built) != 1:
        log(f"ERROR: expected one horovod-{HOROVOD_VERSION} wheel in {wheels}, found {[p.name for p in built]}")
        return 1
    wheel = built[0]

    requirements = runtime_requirements(wheel)
    missing = missing_here(requirements)
    if missing:  # the only step that needs PyPI besides the sdist download
        log(f"this image lacks {', '.join(missing)}: adding their wheels (and their dependencies')")
        got = run([python, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels), *missing])
        if got.returncode != 0:
            log(f"ERROR: pip wheel {' '.join(missing)} failed with status {got.returncode}")
            return 1
    else:
        log(f"this image has every runtime dependency of Horovod already ({', '.join(requirements)})")

    # What a training host of this image will run, without an index.
    dry = run([python, "-m", "pip", "install", "--dry-run", "--no-index", "--find-links", str(wheels),
               f"horovod=={HOROVOD_VERSION}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if dry.returncode != 0:
        sys.stdout.write(dry.stdout)
        log("ERROR: installing from these wheels without an index would fail here")
        return 1
    frameworks = [f for f in (args.frameworks.split(",") if args.frameworks else EXTENSIONS) if f in EXTENSIONS]
    frameworks = [f for f in frameworks if _installed(EXTENSIONS[f][1])]
    checked: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as scratch:
        unpacked = run([python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target", scratch,
                        str(wheel)])
        if unpacked.returncode != 0:
            log("ERROR: could not unpack the wheel")
            return 1
        for framework in frameworks:
            module, package = EXTENSIONS[framework]
            probe = subprocess.run(
                [python, "-c", f"import {module} as hvd, horovod; print(horovod.__file__); print(int(bool(hvd.nccl_built())))"],
                capture_output=True, text=True, env={**os.environ, "PYTHONPATH": scratch, "TF_CPP_MIN_LOG_LEVEL": "3"},
            )
            lines = probe.stdout.strip().splitlines()
            if probe.returncode != 0 or not lines or not lines[0].startswith(scratch):
                log(f"ERROR: {module} from the built wheel does not import here:\n{probe.stderr[-2000:]}")
                return 1
            checked[framework] = {"version": _version(package), "nccl_built": lines[-1] == "1"}
            log(f"{module} from the wheel imports with {package} {_version(package)} "
                f"(NCCL {'built' if checked[framework]['nccl_built'] else 'not built'})")
    if not checked:
        log("ERROR: neither torch nor tensorflow is installed in this image: nothing to check the wheel against")
        return 1
    record = {
        "horovod_version": HOROVOD_VERSION,
        "python": f"cp{sys.version_info[0]}{sys.version_info[1]}",
        "python_version": sys.version.split()[0],
        "frameworks": checked,
        "nccl_built": all(c["nccl_built"] for c in checked.values()),
        "source": source,
        "wheels": sorted(p.name for p in wheels.glob("*.whl")),
        "dependencies_in_image": [r for r in requirements if r not in missing],
        "seconds": round(time.monotonic() - t0, 1),
        "instance_type": os.environ.get("SM_CURRENT_INSTANCE_TYPE", ""),
    }
    (out / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    log(f"done in {record['seconds']:.0f} s: {', '.join(record['wheels'])}")
    print(json.dumps(record), flush=True)
    return 0


def _version(package: str) -> str:
    """The installed version of `package`, or of its CPU-only distribution (`tensorflow-cpu`, what
    the workshop's own environment installs: the same `tensorflow` module)."""
    for name in (package, f"{package}-cpu"):
        try:
            return version(name)
        except PackageNotFoundError:
            pass
    raise PackageNotFoundError(package)


def _installed(package: str) -> bool:
    try:
        _version(package)
        return True
    except PackageNotFoundError:
        return False


if __name__ == "__main__":
    sys.exit(main())
