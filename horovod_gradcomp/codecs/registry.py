"""Name -> codec class registry (no if/elif chains: a codec registers itself)."""
from __future__ import annotations

from typing import Callable, Dict, List, Type

from .base import Codec

_REGISTRY: Dict[str, Type[Codec]] = {}


def register_codec(name: str) -> Callable[[Type[Codec]], Type[Codec]]:
    """Class decorator: make ``get_codec(name)`` build this class."""
    def deco(cls: Type[Codec]) -> Type[Codec]:
        if name in _REGISTRY:
            raise ValueError(f"codec {name!r} is registered twice ({_REGISTRY[name].__name__}, {cls.__name__})")
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return deco


def available_codecs() -> List[str]:
    """Names accepted by :func:`get_codec`, sorted."""
    return sorted(_REGISTRY)


def codec_class(name: str) -> Type[Codec]:
    """The class registered as ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; available: {', '.join(available_codecs())}") from None


def get_codec(name: str, **options) -> Codec:
    """Build the codec registered as ``name`` with its options (``impl="native"`` by default,
    ``impl="reference"`` for the pure-torch oracle)."""
    return codec_class(name)(**options)
