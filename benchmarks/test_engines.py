"""Every registered engine on every case of the grid: latency (``test_forward``), then peak
memory (``test_peak_memory``). The benchmarks live in ``mlexec.suite.benchmarks`` so that any
repository with the plugin installed runs them by these same two lines."""
from mlexec.suite.benchmarks import pinned_engine, test_forward, test_peak_memory  # noqa: F401
