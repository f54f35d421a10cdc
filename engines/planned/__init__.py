"""The project's own engines, one per module: ``naive`` (eager NumPy, the baseline every other is
measured against), ``static`` and ``arena`` (the ops' ``out=`` calls over planned buffers, on
``compiled``'s ``BoundEngine``), ``fused`` (fused steps, folded weights; the base of the extension
protocol that ``packed`` and ``onednn`` build on, ``fused.FusedEngine``'s docstring).

May import: ``engines.base``, ``engines.kernels``, ``engines.importer.passes`` and below.
"""
