"""Finding a shared library inside an installed wheel (MKL's ``libmkl_rt``, oneDNN's ``libdnnl``)."""
from __future__ import annotations

import re
from importlib import metadata


def package_file(package: str, pattern: str) -> str | None:
    """The path of the first file of installed ``package`` whose name matches ``pattern``; None
    when the package or such a file is missing."""
    try:
        files = metadata.files(package) or ()
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if re.fullmatch(pattern, f.name):
            return str(f.locate())
    return None
