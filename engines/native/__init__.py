"""The native libraries, one module each, each owning its loading, its thread settings and its
handles: ``mkl`` (Intel MKL's runtime, CBLAS), ``onednn`` (oneDNN's C API, its matmul as a kernel;
``onednn_int8``: its integer primitives, on ``onednn``'s handles),
``openblas`` (NumPy's and SciPy's OpenBLAS: core type, thread count), ``openmp`` (GNU OpenMP: spin,
thread count), ``threads`` (the BLAS pool's size), ``package`` (finding a library in a wheel).

May import: ``engines.errors`` and ``engines.memory``. ``openblas`` and ``openmp`` import no NumPy:
``engines`` calls their ``choose()`` before NumPy loads.
"""
