"""Codecs: encode a gradient into a payload and back. Importing a module registers it."""
from .base import BufferSpec, Codec, Payload
from .registry import available_codecs, get_codec, register_codec
from .streams import CounterStream
from . import onebit  # noqa: F401  (registers "onebit")
from . import qsgd  # noqa: F401
from . import dgc  # noqa: F401
from . import terngrad  # noqa: F401

__all__ = ["BufferSpec", "Codec", "CounterStream", "Payload", "available_codecs", "get_codec", "register_codec"]
