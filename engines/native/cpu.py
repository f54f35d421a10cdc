"""This CPU as ``/proc/cpuinfo`` describes it: its vendor and feature flags (empty where the file is
missing). No NumPy import here: ``openblas`` reads it before NumPy loads."""
from __future__ import annotations

import functools

# Flags of the int8 dot-product instructions (AVX-512 VNNI, AVX-VNNI, AMX): without them x86 int8
# kernels sum u8 x s8 products in pairs in 16 bits, which saturates (``onednn_int8.int8_dot_product``)
INT8_DOT_PRODUCT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


@functools.lru_cache(maxsize=None)
def vendor_and_flags() -> tuple[str, frozenset[str]]:
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return "", frozenset()
    fields = dict(line.split(":", 1) for line in text.split("\n\n")[0].splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    return fields.get("vendor_id", ""), frozenset(fields.get("flags", "").split())


def int8_dot_product() -> bool:
    """Whether this CPU has int8 dot-product instructions (VNNI or AMX)."""
    return bool(INT8_DOT_PRODUCT_FLAGS & vendor_and_flags()[1])
