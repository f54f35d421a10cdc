"""mlexec.heap: with the heap pinned, freed blocks are reused without page faults."""
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A 1 MiB block freed (glibc's thresholds follow it up), then 4 x 900 KiB from the heap and freed,
# twenty times: without pinning, glibc trims the heap after each round and the next one faults
# every page back in.
CHURN = textwrap.dedent("""
    import resource, sys
    import numpy as np
    sys.path.insert(0, {root!r})
    if {pin}:
        from mlexec import heap
        print(heap.pin())
    big = np.ones(1 << 18); del big
    def churn():
        blocks = [np.ones(900 * 256) for _ in range(4)]
        del blocks
    churn()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        churn()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
""")


def faults_per_round(pin: bool) -> tuple[str, float]:
    out = subprocess.run([sys.executable, "-c", CHURN.format(root=str(ROOT), pin=pin)],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    return (out[0] if pin else ""), float(out[-2])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="pins glibc's malloc; other platforms are left as is")
def test_pinned_heap_reuses_freed_blocks_without_page_faults():
    _, unpinned = faults_per_round(pin=False)
    how, pinned = faults_per_round(pin=True)
    assert unpinned > 500          # 3.6 MiB trimmed and faulted back in each round (~900 pages)
    assert pinned == 0
    assert how.startswith("glibc malloc pinned")


def test_pin_is_idempotent_and_says_how():
    from mlexec import heap
    assert heap.pin() == heap.pin() and heap.pin()
