"""The cost of writing through the page cache as a file grows (docs/performance.md, session 9).

    sync; echo 3 > /proc/sys/vm/drop_caches   # root: start cold
    .venv/bin/python bench/page_cache_write.py DIR [plain|sfr|fadv]

Writes 3 GiB in 1 MiB ``write`` calls to ``DIR/z.tmp`` and prints wall and CPU seconds per 370 MiB (one slab of
the issue-#18 benchmark model). ``plain``: ordinary writes; ``sfr``: ``sync_file_range`` starts each 64 MiB's
writeback as it is written (what rnnconvert's verified writer does, ``speed/directio.start_writeback``);
``fadv``: also waits for the 64 MiB before that to reach the disk and drops it from the cache
(``posix_fadvise(DONTNEED)``), so that later writes reuse its pages. The file is removed at the end.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

import numpy as np


def main(argv: list[str]) -> None:
    out_dir, mode = argv[0], (argv[1] if len(argv) > 1 else "plain")
    libc = ctypes.CDLL(None, use_errno=True)
    path = os.path.join(out_dir, "z.tmp")
    buf = np.random.default_rng(0).integers(0, 255, 1 << 20, dtype=np.uint8).tobytes()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    rows, t0, c0, start = [], time.perf_counter(), time.thread_time(), time.perf_counter()
    try:
        for i in range(1, 3 * 1024 + 1):
            os.write(fd, buf)
            if mode in ("sfr", "fadv") and i % 64 == 0:
                libc.sync_file_range(fd, ctypes.c_longlong((i - 64) << 20), ctypes.c_longlong(64 << 20), 2)
                if mode == "fadv" and i > 128:
                    libc.sync_file_range(fd, ctypes.c_longlong((i - 128) << 20), ctypes.c_longlong(64 << 20), 7)
                    os.posix_fadvise(fd, (i - 128) << 20, 64 << 20, os.POSIX_FADV_DONTNEED)
            if i % 370 == 0:
                rows.append(f"wall {time.perf_counter() - t0:.2f} cpu {time.thread_time() - c0:.2f}")
                t0, c0 = time.perf_counter(), time.thread_time()
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(path)
    print(mode, f"total {time.perf_counter() - start:.2f} s;", " | ".join(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
