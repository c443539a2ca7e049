"""Settings read from the environment (one parser, one error message for all of them)."""
from __future__ import annotations

import math
import os
from typing import Optional


def seconds_from_env(name: str, meaning_of_zero: str) -> Optional[float]:
    """The environment variable ``name`` as seconds >= 0 (finite), or None when it is not set.
    A value that is not such a number raises ValueError naming the variable; ``meaning_of_zero``
    says in that message what 0 does."""
    raw = os.environ.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a number of seconds >= 0 (0: {meaning_of_zero}), got {raw!r}")
    return value


def flag_from_env(name: str) -> bool:
    """The environment variable ``name`` as a switch: False when unset, empty or ``0``; True when
    ``1``. Any other value raises ValueError naming the variable."""
    raw = os.environ.get(name, "").strip()
    if raw in ("", "0"):
        return False
    if raw == "1":
        return True
    raise ValueError(f"{name} must be 1 (on) or 0 (off), got {raw!r}")


#: Ranks per node of the hierarchical exchange (:mod:`horovod_gradcomp.exchange.topology`): a
#: positive integer that overrides what the launcher says (nodes are then consecutive blocks of
#: ranks), so that tests can lay out 2 nodes x 2 ranks on one host.
RANKS_PER_NODE_ENV = "HOROVOD_GRADCOMP_RANKS_PER_NODE"


def positive_int_from_env(name: str) -> Optional[int]:
    """The environment variable ``name`` as an integer >= 1, or None when it is unset or empty.
    Any other value raises ValueError naming the variable."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name} must be a positive integer (ranks per node), got {raw!r}")
    return value


__all__ = ["RANKS_PER_NODE_ENV", "flag_from_env", "positive_int_from_env", "seconds_from_env"]
