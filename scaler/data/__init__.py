"""Data shipped in the package: example policies, bundled trace slices and their licences.

In the repository `policies` and `traces` are links to `config/` and `loadtests/traces/`
(one copy of each file); a wheel holds the files themselves. Read them through `path`.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path


def path(*parts: str) -> Path:
    """The file or folder `parts` under the package data, as a filesystem path.

    The package is installed as files (pip never installs it zipped), so the resource is
    a real path that the trace and policy loaders can open and list.
    """
    resource = importlib.resources.files(__name__).joinpath(*parts)
    if not isinstance(resource, Path):
        raise RuntimeError(f"scaler's data is not on the filesystem ({resource}): install "
                           "the package unzipped")
    return resource
