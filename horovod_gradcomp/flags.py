"""One check for the on/off options users pass: a flag must be a real ``bool``.

``bool("false")`` is True, so a flag read from a command line or a config file as the string
``"false"`` would silently turn an option *on*; these options refuse anything but ``True`` and
``False`` (numpy's bool included) with a message naming the option and the value.
"""
from __future__ import annotations


def require_flag(owner: str, name: str, value) -> bool:
    """``value`` as a Python bool; ``ValueError("<owner>: <name> must be True or False, got ...")``
    for anything else (strings, ints, None)."""
    if isinstance(value, bool):
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):  # numpy 2 and 1
        return bool(value)
    raise ValueError(f"{owner}: {name} must be True or False, got {value!r}")


__all__ = ["require_flag"]
