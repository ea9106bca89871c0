"""The labs: every `<N>_<name>/lab.py` in the repository, found and loaded once.

A lab is its folder plus the `Lab` spec its `lab.py` defines (`LAB = Lab(...)`, or `LABS = [...]`
for a folder with several scripts; see `workshop.spec` and CONTRIBUTING.md). The CLI, the
runner, the notebooks and the tests all read this one registry, so adding a lab is adding a
folder: nothing in `workshop/` names a lab.

    from workshop.labs import get_lab
    lab = get_lab("data_parallel")        # by key, folder name, number or alias
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from workshop import REPO_ROOT
from workshop.errors import WorkshopError
from workshop.spec import SCRIPT_KEY, Lab, SageMakerDefaults, hyperparameters_to_argv, load_module

__all__ = ["LABS", "Lab", "SageMakerDefaults", "find_lab", "get_lab", "get_labs", "hyperparameters_to_argv", "job_keys",
           "load_lab_folder"]

LAB_FOLDER_GLOB = "[0-9]*_*/lab.py"


def load_lab_folder(folder: str | Path) -> list[Lab]:
    """The labs a folder's `lab.py` defines (`LAB` or `LABS`), checked to be `Lab`s of that folder."""
    path = Path(folder).resolve() / "lab.py"
    if not path.is_file():
        raise WorkshopError(f"{path.parent} has no lab.py.", "define LAB = workshop.spec.Lab(...) in it (see CONTRIBUTING.md).")
    module = load_module(path, f"_workshop_lab_spec_{path.parent.name}")
    labs = list(getattr(module, "LABS", None) or [getattr(module, "LAB", None)])
    for i, lab in enumerate(labs):
        if not isinstance(lab, Lab):
            raise WorkshopError(f"{path} defines no Lab (LAB or LABS): found {lab!r}.", "see CONTRIBUTING.md.")
        if lab.folder == path.parent.name and path.parent.parent != REPO_ROOT:
            # `folder` names the folder lab.py is in; outside the repository, that folder is elsewhere
            labs[i] = lab = dataclasses.replace(lab, folder=str(path.parent))
        if lab.path.resolve() != path.parent:
            raise WorkshopError(f"{path} defines lab {lab.key!r} with folder {lab.folder!r}, not its own folder.",
                                f"set folder={path.parent.name!r}.")
    return labs


def _discover() -> dict[str, Lab]:
    labs: dict[str, Lab] = {}
    for path in sorted(REPO_ROOT.glob(LAB_FOLDER_GLOB)):
        for lab in load_lab_folder(path.parent):
            if lab.key == SCRIPT_KEY:
                raise WorkshopError(f"{lab.folder}/lab.py names a lab {SCRIPT_KEY!r}, the key of the jobs of scripts of "
                                    "your own (python -m workshop run-script).", "give the lab another key.")
            if lab.key in labs:
                raise WorkshopError(f"Two labs are called {lab.key!r} ({labs[lab.key].folder}, {lab.folder}).",
                                    "give one of them another key.")
            labs[lab.key] = lab
    return labs


LABS: dict[str, Lab] = _discover()


def get_lab(name: str) -> Lab:
    """Find a lab by key, folder name, number or alias."""
    for lab in LABS.values():
        if name == lab.key or name in lab.aliases:
            return lab
    group = [lab for lab in LABS.values() if name in lab.group_aliases]
    if group:
        raise WorkshopError(
            f"{name!r} names {len(group)} labs: " + ", ".join(lab.key for lab in group) + ".",
            "pick one of them (the command line's `run` takes the folder and runs them all).",
        )
    known = ", ".join(f"{lab.key} ({lab.folder})" for lab in LABS.values())
    raise WorkshopError(f"Unknown lab {name!r}.", f"choose one of: {known}, or 'all'.")


def get_labs(name: str) -> list[Lab]:
    """The labs `name` selects: one by key or alias, or every lab of a folder (e.g. 2_horovod)."""
    group = [lab for lab in LABS.values() if name in lab.group_aliases]
    return group or [get_lab(name)]


def find_lab(key: str, folder: str | Path) -> Lab:
    """Lab `key`, from the registry or else from `folder`'s lab.py (a lab outside the checkout):
    how a child process finds the lab its parent was given."""
    if key in LABS:
        return LABS[key]
    for lab in load_lab_folder(folder):
        if lab.key == key:
            return lab
    raise WorkshopError(f"{folder}/lab.py defines no lab {key!r}.", "pass a lab its folder defines.")


def job_keys() -> list[str]:
    """Every lab's key, and the key of your own scripts' jobs (`workshop.spec.SCRIPT_KEY`, `python -m workshop
    run-script`): the jobs the workshop role's S3 access and the cleanup cover."""
    return [*LABS, SCRIPT_KEY]
