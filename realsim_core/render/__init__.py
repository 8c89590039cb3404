"""Differentiable Gaussian rendering: tile rasteriser (JAX), dense reference, SplatMesh."""

from realsim_core.render.rasterize import (
    Projected,
    RenderOutput,
    covariance_from_quat_scale,
    pair_count,
    project,
    rasterize,
)
from realsim_core.render.reference import render_reference
from realsim_core.render.sh import eval_sh, num_sh_bases, rgb_to_sh0

__all__ = [
    "Projected",
    "RenderOutput",
    "covariance_from_quat_scale",
    "eval_sh",
    "num_sh_bases",
    "pair_count",
    "project",
    "rasterize",
    "render_reference",
    "rgb_to_sh0",
]
