"""CPU time of a call, for tests that compare the work done at two sizes."""

from __future__ import annotations

import time
from collections.abc import Callable


def cpu_per_call(call: Callable[[], object]) -> float:
    """CPU seconds per call, averaged over enough calls for the clock."""
    calls, start = 0, time.process_time()
    while (spent := time.process_time() - start) < 0.02:
        call()
        calls += 1
    return spent / calls
