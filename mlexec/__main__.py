"""``python -m mlexec``: the same command line as the ``mlexec`` script."""
import sys

from .cli import main

sys.exit(main())
