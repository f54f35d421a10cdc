"""The model IR and its op tables: ``models`` (``Model``, ``Op``, the zoo), ``ops`` (one
``OpKind`` per op kind: eager form, ``out=`` calls, flops, in-place rules; ``OPS`` is the one
table), ``conv`` (the CNN kinds, merged into ``OPS``), ``calls`` (what both build on).

May import: ``engines.memory``. Nothing above it: no engine, kernel or library.
"""
