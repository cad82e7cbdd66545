"""Where the modules of the flat layout went (one folder per layer), so that an old import
path (`import aioloader.storage`, `from aioloader.retry import RetryPolicy`, a pickle naming
an old module) still finds its module, with a DeprecationWarning naming the new path.

A finder on `sys.meta_path` answers only for these names, and only when one is imported:
`import aioloader` loads nothing for it.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from importlib.machinery import ModuleSpec
from types import ModuleType

#: old name -> new name, under `aioloader.`
MOVED = {
    "access": "runtime.access",
    "autotune": "runtime.autotune",
    "backends": "io.backends",
    "blocks": "index.blocks",
    "cli": "tools.cli",
    "cli_cat": "tools.cli_cat",
    "cli_convert": "tools.cli_convert",
    "collate": "elements.collate",
    "columns": "elements.columns",
    "convert": "tools.convert",
    "curl": "io.gcs.curl",
    "curlwatch": "io.gcs.curlwatch",
    "dataset": "describe.dataset",
    "dataslices": "index.dataslices",
    "description": "describe.description",
    "descriptors": "io.descriptors",
    "gate": "io.gate",
    "gcs_client": "io.gcs.client",
    "gcs_curl": "io.gcs.backend",
    "gcs_store": "io.gcs.store",
    "graph": "runtime.graph",
    "hedge": "io.hedge",
    "index_cache": "cache.index_cache",
    "indexplan": "index.indexplan",
    "lanes": "index.lanes",
    "lifecycle": "runtime.lifecycle",
    "loopstate": "io.loopstate",
    "memfile": "io.memfile",
    "mixed": "describe.mixed",
    "objects": "describe.objects",
    "packing": "elements.packing",
    "permutation": "index.permutation",
    "plan": "describe.plan",
    "planning": "index.planning",
    "privatedir": "cache.privatedir",
    "reach": "io.reach",
    "retry": "io.retry",
    "runtime.statekeeping": "runtime.position",
    "sampling": "index.sampling",
    "selection": "index.selection",
    "shortread": "io.shortread",
    "staged": "tools.staged",
    "stages": "describe.stages",
    "state": "describe.state",
    "storage": "io.storage",
    "stores": "io.stores",
    "sync": "io.sync",
    "tfexample": "elements.tfexample",
    "transforms": "elements.transforms",
    "typed": "elements.typed",
}


class _Alias:
    """Loads an old name as the module under its new name (one module, two names)."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.spec: ModuleSpec | None = None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        warnings.warn(f"{spec.name} moved to {self.new}: import it from there (the old "
                      "path goes in a later release)", DeprecationWarning, stacklevel=3)
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # already executed under its new name; importing it under the old one set its
        # `__spec__` to the alias's: give it back its own
        module.__spec__ = self.spec


class _Finder:
    """A meta path finder (duck-typed: `importlib.abc` would cost the import its time)."""

    def find_spec(self, name: str, path: object = None,
                  target: object = None) -> ModuleSpec | None:
        new = MOVED.get(name[len("aioloader."):]) if name.startswith("aioloader.") else None
        if new is None:
            return None
        return ModuleSpec(name, _Alias("aioloader." + new))  # type: ignore[arg-type]


def install() -> None:
    """Put the finder first on `sys.meta_path` (once): the old names have no files."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
