"""The clock a PostgreSQL spool carries its estimate of the database's clock forward on."""

from __future__ import annotations

import time

# Counts on through a suspend (a resumed VM or laptop), unlike CLOCK_MONOTONIC, and is
# never stepped; slewed at the same rate as the wall clock by NTP.
_STEADY_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def steady() -> float:
    """Seconds on a clock that a step of the wall clock leaves alone."""
    return time.clock_gettime(_STEADY_CLOCK)
