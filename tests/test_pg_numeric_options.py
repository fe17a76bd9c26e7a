"""PostgreSQL: a spool created with a seconds option the checks accept as a number but
JSON cannot hold as given (numpy.float32, Fraction) stores it as a plain float, as the
file spool does; it raised "Object of type float32 is not JSON serializable" from deep
in psycopg, a traceback at `Spool(url, lease_seconds=np.float32(5))`."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from tests.spools import make_spool


def test_numeric_options_are_stored_as_plain_numbers(pg_url: str, tmp_path: object) -> None:
    for root in (pg_url, str(tmp_path)):
        with make_spool(root, lease_seconds=np.float32(5),
                        retry_base_seconds=Fraction(1, 2)) as spool:
            assert spool.lease_seconds == 5.0 and type(spool.lease_seconds) is float
        with make_spool(root) as again:  # the stored settings, read back
            assert again.lease_seconds == 5.0
            assert again.policy.base_seconds == 0.5, root
