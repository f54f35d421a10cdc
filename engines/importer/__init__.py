"""The ONNX importer: ``load`` reads and checks a file (``load_onnx``), ``lower`` turns its nodes
into IR ops (one ``LOWER`` entry per ONNX op type), ``passes`` rewrites the IR (fusions and
folds, one function per rewrite, applied in ``PASSES`` order).

May import: ``engines.ir`` and below, and the ``onnx`` package (lazily). No engine, kernel or library.
"""
