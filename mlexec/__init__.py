"""The analyzer: measure the engines on user input, from the command line or the web."""

import engines  # noqa: E402,F401  (first: it picks OpenBLAS's kernels for this CPU before NumPy loads)
