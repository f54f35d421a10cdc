"""The benchmark suite: ``plugin`` (pytest options, parametrization, fixtures, hooks),
``benchmarks`` (the two benchmarks) and ``session`` (results, the gate's measurements, the
report) are pytest-bound; ``grid``, ``gate``, ``roofs``, ``memory``, ``summary``
and ``basecode`` are plain code the plugin calls; ``ci`` is what the workflows and the action
(``action.yml``) run; ``example`` writes the user's repository that docs/gate.md describes."""
