"""Byte sizes as people write them on a command line: ``8G``, ``500M``, ``64KiB``, ``1048576``."""

from __future__ import annotations

import re

from hpcdl.common.exceptions import HpcdlError

SIZE_FORMS = "a number of bytes or one with a unit K, M, G or T (powers of 1024), e.g. 4096, 64KiB, 1M, 8G"
_SIZE = re.compile(r"^(\d+)\s*([kmgt]?)(?:i?b)?$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes in `text` (see SIZE_FORMS); HpcdlError saying what is allowed otherwise."""
    match = _SIZE.match(text.strip())
    if not match:
        raise HpcdlError(f"'{text}' is not a size; write {SIZE_FORMS}")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]
