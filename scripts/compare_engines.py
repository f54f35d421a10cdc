"""Moved to ``mlexec report`` (mlexec/report/); this shim forwards its arguments there."""
import pathlib, sys; sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # noqa: E401,E702
from mlexec.cli import main; sys.exit(main(["report", *sys.argv[1:]]))  # noqa: E402,E702
