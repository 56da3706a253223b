"""End a running job cleanly: ``asyncrl stop RUN [--address ADDR]`` (asyncrl/scale.py says how RUN is found)."""
from __future__ import annotations

import sys

from asyncrl.scale import stop_main as main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
