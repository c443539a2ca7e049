"""The residual cap: error feedback that never falls more than a few gradients behind.

After an error-feedback encode, ``r <- v - decode(payload)``. Where the quantizer keeps little of
``v``'s energy, ``r`` grows to many times the gradient and the update becomes mostly stale
residual (docs/results/onebit_divergence.md, sections 1-2). With ``cap = c > 0`` each group's
residual (a row, a column or a 1-D tensor: the quantizer's own groups) is scaled down, after
the update, so that its norm is at most ``c`` times the norm of the same group of the
gradient just encoded; a group whose residual is already within the cap is left bitwise as it
was. It changes only what is carried to the next step: the payload of this step, its bytes
and the averaged gradient are those of the uncapped encode, so the gradient's scale is not
touched.

Pure torch (the same code after the native and the reference encode); float32 arithmetic for
16-bit residuals, the residual's own dtype otherwise.
"""
from __future__ import annotations

import torch


def check_cap(codec: str, value) -> float:
    """``value`` as a float when it is a finite number >= 0 (0: no cap); a ValueError naming ``codec``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
        raise ValueError(f"{codec}: residual_cap must be a finite number >= 0 (0: no cap), got {value!r}")
    return float(value)


def cap_grid(residual: torch.Tensor, grad: torch.Tensor, cap: float, dim: int) -> None:
    """:func:`cap_residual` on 2-D views (``residual`` may be a strided view: written in place),
    the groups being the slices along ``1 - dim`` and each group's norm taken over ``dim``."""
    if cap <= 0 or residual.numel() == 0:
        return
    acc = torch.float32 if residual.dtype in (torch.float16, torch.bfloat16) else residual.dtype
    r_norm = residual.norm(dim=dim, keepdim=True, dtype=acc)
    limit = cap * grad.detach().norm(dim=dim, keepdim=True, dtype=acc)
    over = r_norm > limit  # no host read-back: no device sync on CUDA tensors
    # 1 where a group is within its cap (x * 1 is x bitwise), limit / norm where it is over: one
    # multiply in place instead of a masked copy (three passes over the residual, not seven).
    factor = torch.where(over, limit / torch.where(over, r_norm, torch.ones_like(r_norm)), torch.ones_like(r_norm))
    if residual.dtype == acc:
        residual.mul_(factor)
    else:
        residual.copy_((residual.to(acc) * factor).to(residual.dtype))


def cap_residual(residual: torch.Tensor, grad: torch.Tensor, cap: float, groups: int, by_rows: bool) -> None:
    """Scale each group of the contiguous ``residual`` in place to a norm of at most ``cap`` times
    the norm of the same group of ``grad`` (groups: ``groups`` rows of the ``[groups, -1]`` view
    when ``by_rows``, else ``groups`` columns of the ``[-1, groups]`` view; 1 column for 1-D).
    ``cap`` 0: nothing. A group within its cap keeps its values bitwise; a group whose gradient
    is all zero gets a zero residual."""
    if cap <= 0 or residual.numel() == 0:
        return
    if by_rows:
        cap_grid(residual.view(groups, -1), grad.reshape(groups, -1), cap, 1)
    else:
        cap_grid(residual.view(-1, groups), grad.reshape(-1, groups), cap, 0)


def cap_window(residual: torch.Tensor, grad: torch.Tensor, cap: float, cols: int, start: int, stop: int) -> None:
    """:func:`cap_residual` of the columns ``[start, stop)`` of the ``[-1, cols]`` views (a
    two-phase column window; each column is a group, so this is the full tensor's cap there)."""
    if cap <= 0:
        return
    cap_grid(residual.view(-1, cols)[:, start:stop], grad.reshape(-1, cols)[:, start:stop], cap, 0)


__all__ = ["cap_grid", "cap_residual", "cap_window", "check_cap"]
