"""The convolutional front end: images (or feature sequences) → one feature vector per column.

Puigcerver (ICDAR 2017, "Are multidimensional recurrent layers really necessary for
handwritten text recognition?"): a few convolution blocks followed by 1-D BLSTM layers
match MDLSTM at a fraction of the cost. Each block is convolution → normalisation →
ReLU → channel dropout → max pooling; the last block's output (C, H', T') is flattened
per column into C·H' features, the input of the existing BLSTM-CTC layers.

Shapes: T columns (frames), N images, H pixels per column, C channels. The input is the
column frames the data layer serves, (T, N, H·C), each frame a column's pixels top to
bottom with C values each (``rnntrain.data.ncdata.columns``). 1-D data (speech features)
is the case H = 1, C = features: the blocks are then time convolutions (kernel 1 × k)
with subsampling by the width pooling.

Exact masking: the output for an image alone equals its output inside a zero-padded
batch. Padded columns are zero before every convolution (as the convolution's own zero
padding is for the image alone), are excluded from the normalisation statistics, and are
-inf inside max pooling; output lengths follow the pooling (ceil mode: ceil(T / p)).
Normalisation is per image ("group": GroupNorm statistics over the image's valid columns),
so training-mode outputs are exact too and do not depend on how a batch is split into
worker tasks. Batch normalisation is deliberately not offered: its training-mode
statistics mix the images of a micro-batch (results would depend on the thread count),
and its running statistics would be mutated concurrently by the worker threads and
differ between MPI ranks.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def column_mask(lengths: torch.Tensor, t: int, device) -> torch.Tensor:
    """(N,) lengths → (N, 1, 1, T) bool, True on valid columns."""
    m = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    return m.to(device).view(len(lengths), 1, 1, t)


def groups_for(channels: int, max_groups: int = 8) -> int:
    """The largest group count <= max_groups that divides ``channels``."""
    return next(g for g in range(min(max_groups, channels), 0, -1) if channels % g == 0)


class MaskedGroupNorm(nn.Module):
    """GroupNorm whose statistics cover only each image's valid columns.

    x: (N, C, H, T), mask: (N, 1, 1, T) float → (N, C, H, T)."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.groups, self.eps = groups_for(channels), eps
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n, c, h, t = x.shape
        g = self.groups
        xf = x.float().view(n, g, c // g, h, t)
        m = mask.view(n, 1, 1, 1, t).to(xf.dtype)
        count = (m.sum(dim=(2, 3, 4), keepdim=True) * (c // g) * h).clamp(min=1.0)
        mean = (xf * m).sum(dim=(2, 3, 4), keepdim=True) / count
        var = (((xf - mean) * m) ** 2).sum(dim=(2, 3, 4), keepdim=True) / count
        y = ((xf - mean) * torch.rsqrt(var + self.eps)).view(n, c, h, t)
        y = y * self.weight.view(1, c, 1, 1) + self.bias.view(1, c, 1, 1)
        return y.to(x.dtype)


class ConvBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: tuple[int, int], pool: tuple[int, int],
                 norm: str, dropout: float):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, padding=(kernel[0] // 2, kernel[1] // 2),
                              bias=norm == "none")
        self.norm = MaskedGroupNorm(c_out) if norm == "group" else None
        self.pool, self.dropout = pool, dropout

    def forward(self, x, lengths, mask, generator=None):
        """x: (N, C_in, H, T) zero at padded columns → (N, C_out, H/ph, T/pw), lengths."""
        y = self.conv(x)
        if self.norm is not None:
            y = self.norm(y, mask)
        y = F.relu(y)
        if self.dropout and self.training:  # channel dropout, drawn from the task's generator
            keep = 1.0 - self.dropout
            m = torch.empty(y.shape[0], y.shape[1], 1, 1).bernoulli_(keep, generator=generator)
            y = y * (m.to(y.device, y.dtype) / keep)
        ph, pw = self.pool
        if ph > 1 or pw > 1:
            y = F.max_pool2d(y.masked_fill(~mask, float("-inf")), (ph, pw), (ph, pw),
                             ceil_mode=True)
            lengths = (lengths + pw - 1) // pw
            mask = column_mask(lengths, y.shape[3], y.device)
        return y.masked_fill(~mask, 0.0), lengths, mask


class ConvFrontEnd(nn.Module):
    """Convolution blocks that turn (T, N, H·C) column frames into (T', N, C'·H') frames.

    channels: output channels per block; kernel: odd kernel size (k × k, or 1 × k when
    H = 1); pool_h / pool_w: max-pooling factors per block over the height and over the
    columns (the width pooling subsamples time: T' = ceil(T / prod(pool_w))).
    """

    def __init__(self, in_channels: int, height: int, channels: list[int], kernel: int,
                 pool_h: list[int], pool_w: list[int], norm: str = "group",
                 dropout: float = 0.0):
        super().__init__()
        assert len(channels) == len(pool_h) == len(pool_w) and kernel % 2 == 1
        self.in_channels, self.height = in_channels, height
        blocks, c, h = [], in_channels, height
        for c_out, ph, pw in zip(channels, pool_h, pool_w):
            kh = kernel if h > 1 else 1
            ph = ph if h > 1 else 1
            blocks.append(ConvBlock(c, c_out, (kh, kernel), (ph, pw), norm, dropout))
            c, h = c_out, -(-h // ph)
        self.blocks = nn.ModuleList(blocks)
        self.out_height, self.out_channels = h, c
        self.output_size = c * h
        self.subsample = math.prod(pool_w)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, generator=None):
        """x: (T, N, H·C) zero-padded, lengths (N,) on the CPU → (T', N, C'·H'), lengths."""
        t, n, _ = x.shape
        x = x.view(t, n, self.height, self.in_channels).permute(1, 3, 2, 0)  # (N, C, H, T)
        mask = column_mask(lengths, t, x.device)
        x = x.masked_fill(~mask, 0.0)  # padding is zero already; keeps the invariant explicit
        for blk in self.blocks:
            x, lengths, mask = blk(x, lengths, mask, generator)
        n, c, h, t = x.shape
        return x.permute(3, 0, 1, 2).reshape(t, n, c * h), lengths

    def flops_per_column(self) -> float:
        """Multiply-adds × 2 × 3 (forward + backward) per input column."""
        macs, h, div = 0.0, self.height, 1
        for blk in self.blocks:
            conv = blk.conv
            kh, kw = conv.kernel_size
            macs += conv.in_channels * conv.out_channels * kh * kw * h / div
            h, div = -(-h // blk.pool[0]), div * blk.pool[1]
        return 2.0 * 3.0 * macs
