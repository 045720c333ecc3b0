"""CPU priority of the steps that do the heavy work (encode, image decode).

Under overload the cheap work decides how a refusal feels: Triton's frontends and
ensemble threads and the step that admits or refuses (tokenize) must get a core at once,
or a refusal waits behind the very work it refuses. The heavy steps therefore lower
their own priority (a higher nice value) before they start their thread pools, which
inherit it. Nice only matters while the CPU is contended: alone, a niced encoder still
takes every idle core. Raising a nice value needs no privilege.
"""

from __future__ import annotations

import os

WORK_NICE = 5


def lower_priority(nice: int = WORK_NICE) -> int:
    """Raise this thread's nice value to at least ``nice``; the value it has now.

    Threads started afterwards (ONNX Runtime's pools, the decode pool) inherit it.
    """
    current = os.nice(0)
    if current < nice:
        current = os.nice(nice - current)
    return current
