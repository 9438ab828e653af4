"""map_on_threads: NumPy work over large arrays on several threads, for the build's passes
over a model's weights (casts, concatenations, checksums): NumPy lets go of the GIL in
them, so a 1 GB model's weights take a fraction of one core's time."""
from __future__ import annotations

import os

MAX_THREADS = 8  # past this the passes are bound by memory bandwidth, not cores


def map_on_threads(function, items) -> list:
    """[function(item) for item in items], on up to MAX_THREADS threads (one item, or one
    core: in this thread)."""
    items = list(items)
    threads = min(MAX_THREADS, os.cpu_count() or 1, len(items))
    if threads <= 1:
        return [function(item) for item in items]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="byoc-arrays") as pool:
        return list(pool.map(function, items))
