"""Optimizers that exchange their own state: :class:`OnebitAdam` / :class:`OnebitAdamW`
(Adam's momentum exchanged 1-bit with error feedback after a dense warm-up)."""
from .onebit_adam import OnebitAdam, OnebitAdamW

__all__ = ["OnebitAdam", "OnebitAdamW"]
