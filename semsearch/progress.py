"""Progress bars on stderr, shown by default only when stderr is a terminal."""
from __future__ import annotations

import sys


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


def bar(total: int, desc: str, unit: str = "it", progress: bool | None = None, unit_scale: bool = False):
    """A tqdm bar, or a silent stand-in when progress is off (None: on for a terminal)."""
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, unit_scale=unit_scale, leave=False)
