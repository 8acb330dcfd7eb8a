"""``python -m hpcdl.runner.print_debug_dir``: print the diagnostic directory a batch script gives its ranks
(:func:`hpcdl.common.debug_dir.launcher_dir`).

A module of its own because ``hpcdl.common`` imports ``hpcdl.common.debug_dir`` itself: running that module
with ``-m`` would load it twice and make Python warn on the job's output.
"""

from __future__ import annotations

from hpcdl.common.debug_dir import launcher_dir

if __name__ == "__main__":
    print(launcher_dir())
