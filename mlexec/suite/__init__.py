"""Support code for the benchmark suite in benchmarks/: the grid, machine roofs,
memory limits, the interleaved ratio the latency gate reads, and the summary table."""
