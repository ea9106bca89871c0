"""Speed only: two patches every test process applies (conftest's session fixtures, and the kernels of
tests/test_notebooks_sagemaker_mode.py, which install them in their first cell). Neither changes a result.

- `jsonschema.validate` checks the *schema* against its metaschema on every call before validating the
  instance, and the SageMaker SDK validates its config with the same constant schema on every config lookup
  (dozens per dry run or job: most of a dry run's time). Here each distinct schema is checked once per
  process; every instance is still validated, with the same result and errors as `jsonschema.validate`
  (whose body this is).
- botocore caches the service models it parses (multi-megabyte JSON files) per session, and the tests, the
  SDK and moto make hundreds of sessions, so the same files are parsed again and again. Loaders with the
  same class, search paths and extras share that cache here, as every client of one botocore session
  already shares its models.

In a sagemaker-mode notebook's kernel the two took 4-5 s of CPU (py-spy, 2026-11-26), on top of the jobs.
"""

from __future__ import annotations

import json
from typing import Any


def _validate_checking_each_schema_once() -> Any:
    from jsonschema import exceptions, validators

    checked: set[tuple[Any, str]] = set()

    def validate(instance: Any, schema: Any, cls: Any = None, *args: Any, **kwargs: Any) -> None:
        if cls is None:
            cls = validators.validator_for(schema)
        key = (cls, json.dumps(schema, sort_keys=True, default=repr))
        if key not in checked:
            cls.check_schema(schema)
            checked.add(key)
        error = exceptions.best_match(cls(schema, *args, **kwargs).iter_errors(instance))
        if error is not None:
            raise error

    return validate


def _sharing_loader_method(name: str) -> Any:
    from botocore.loaders import Loader

    real = getattr(Loader, name)
    shared: dict[tuple[Any, ...], Any] = {}

    def method(self: Loader, *args: Any, **kwargs: Any) -> Any:
        key = (name, type(self), tuple(self.search_paths), tuple(self.extras_types), args,
               tuple(sorted(kwargs.items())))
        if key not in shared:
            shared[key] = real(self, *args, **kwargs)
        return shared[key]

    return method


def patches() -> list[tuple[Any, str, Any]]:
    """(object, attribute, replacement) for each patch, to set with `setattr` or a MonkeyPatch."""
    import jsonschema
    from botocore.loaders import Loader

    return [(jsonschema, "validate", _validate_checking_each_schema_once()),
            *((Loader, name, _sharing_loader_method(name)) for name in ("load_service_model", "load_data_with_path"))]


def install() -> None:
    """The patches, for the rest of this process (a kernel's)."""
    for target, name, value in patches():
        setattr(target, name, value)
