"""gsplat backend for `rasterize(..., backend="gsplat")` (CUDA + torch + gsplat only).

Same signature and `RenderOutput` as the JAX rasteriser. The forward and backward run in
torch (`gsplat.rasterization`, "classic" mode, eps2d = 0.3 px^2 like ours); JAX sees a
`jax.custom_vjp` whose backward re-runs the torch forward with autograd on and returns
the input gradients (recomputation instead of keeping torch graphs alive across calls).

Data crosses the boundary by DLPack (zero-copy on the GPU) when called eagerly; under
`jax.jit` the calls go through `jax.pure_callback`, which hands over host arrays, so the
jitted path pays a device-host round trip (documented limitation; the GPU check script
times both).

Differences from the JAX rasteriser that the GPU check quantifies: gsplat bounds each
Gaussian at 3 sigma of its 2D covariance (a circle), ours at the exact alpha >= 1/255
ellipse; gsplat has no per-tile capacity (so no overflow: the overflow fields are 0 and
`max_tile_count` is -1). Colours: SH are evaluated in JAX (`eval_sh`) and plain colours
plus extra features are passed as one channel stack; pixel centres are shifted by +0.5
(gsplat puts them at half-integers, we at integers).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from realsim_core.errors import RealsimError
from realsim_core.render.rasterize import RenderOutput, covariance_from_quat_scale
from realsim_core.render.sh import eval_sh
from realsim_core.se3 import pose_inverse
from realsim_core.types import CameraIntrinsics

UNAVAILABLE = "gsplat needs CUDA + torch; not available on this machine"


@functools.cache
def gsplat_available() -> bool:
    """True when torch with CUDA and gsplat import (checked once)."""
    try:
        import gsplat  # noqa: F401
        import torch
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return False
    return bool(torch.cuda.is_available())


def _require():
    if not gsplat_available():
        raise RealsimError(f"backend='gsplat': {UNAVAILABLE}")


def _to_torch(x):
    import torch

    if isinstance(x, jax.Array):
        try:  # zero-copy when the array lives on a CUDA device
            return torch.utils.dlpack.from_dlpack(x).cuda()
        except Exception:  # noqa: BLE001 - host arrays: copy
            x = np.asarray(x)
    return torch.as_tensor(np.ascontiguousarray(x)).cuda()


def _to_np(t):
    return t.detach().float().cpu().numpy()


def _torch_render(arrs, intr: CameraIntrinsics, near: float, use_covars: bool, grad=None):
    """Run gsplat once. arrs: (means, quats|covars, scales, opacities, chans, viewmat, bg).

    Returns (render [H, W, D+1] (channels then accumulated depth), alpha [H, W]) when
    `grad` is None, else the input gradients for the first 6 arrays (float32 numpy).
    """
    import torch
    from gsplat import rasterization

    means, rot, scales, opac, chans, viewmat, bg = [_to_torch(a).float() for a in arrs]
    leaves = [means, rot, scales, opac, chans, viewmat]
    if grad is not None:
        for t in leaves:
            t.requires_grad_(True)
    k = torch.tensor([[intr.fx, 0.0, intr.cx + 0.5], [0.0, intr.fy, intr.cy + 0.5],
                      [0.0, 0.0, 1.0]], device=means.device)
    kwargs = dict(covars=rot, quats=None, scales=None) if use_covars else dict(
        quats=torch.roll(rot, 1, dims=-1), scales=scales)  # xyzw -> wxyz
    with torch.set_grad_enabled(grad is not None):
        render, alpha, _ = rasterization(
            means=means, opacities=opac, colors=chans, viewmats=viewmat[None], Ks=k[None],
            width=intr.width, height=intr.height, near_plane=near, eps2d=0.3,
            backgrounds=torch.cat([bg, torch.zeros(chans.shape[-1] - 3, device=bg.device)])[None],
            render_mode="RGB+D", rasterize_mode="classic", packed=False, **kwargs)
        render, alpha = render[0], alpha[0, ..., 0]
        if grad is None:
            return _to_np(render), _to_np(alpha)
        g_render, g_alpha = (_to_torch(g).float() for g in grad)
        torch.autograd.backward([render, alpha], [g_render, g_alpha])
    out = []
    for t in leaves:
        out.append(np.zeros(tuple(t.shape), np.float32) if t.grad is None else _to_np(t.grad))
    return tuple(out)


def _make_op(intr: CameraIntrinsics, near: float, use_covars: bool, n_chan: int):
    h, w = intr.height, intr.width
    out_shapes = (jax.ShapeDtypeStruct((h, w, n_chan + 1), jnp.float32),
                  jax.ShapeDtypeStruct((h, w), jnp.float32))

    def call_fwd(*arrs):
        return jax.pure_callback(
            lambda *a: _torch_render(a, intr, near, use_covars), out_shapes, *arrs)

    @jax.custom_vjp
    def op(*arrs):
        return call_fwd(*arrs)

    def fwd(*arrs):
        return call_fwd(*arrs), arrs

    def bwd(arrs, cts):
        shapes = tuple(jax.ShapeDtypeStruct(a.shape, jnp.float32) for a in arrs[:6])
        grads = jax.pure_callback(
            lambda *a: _torch_render(a[:7], intr, near, use_covars, grad=a[7:]),
            shapes, *arrs, *cts)
        return tuple(grads) + (jnp.zeros_like(arrs[6]),)

    op.defvjp(fwd, bwd)
    return op


def rasterize_gsplat(means, quats, scales, opacities, colors, cam_pose,
                     intrinsics: CameraIntrinsics, *, covars=None, sh_degree=None,
                     features=None, background=None, near: float = 0.01) -> RenderOutput:
    """The gsplat implementation of `realsim_core.render.rasterize` (same arguments)."""
    _require()
    means = jnp.asarray(means, jnp.float32)
    if sh_degree is not None:
        rgb = eval_sh(sh_degree, colors, means - cam_pose[:3, 3])
    else:
        rgb = colors
    chans = [jnp.asarray(rgb, jnp.float32)]
    if features is not None:
        chans.append(jnp.asarray(features, jnp.float32))
    chans = jnp.concatenate(chans, -1)
    use_covars = covars is not None
    rot = jnp.asarray(covars if use_covars else quats, jnp.float32)
    scl = jnp.zeros_like(means) if use_covars else jnp.asarray(scales, jnp.float32)
    bg = jnp.zeros(3, jnp.float32) if background is None else jnp.asarray(background, jnp.float32)
    viewmat = pose_inverse(jnp.asarray(cam_pose, jnp.float32))
    op = _make_op(intrinsics, near, use_covars, chans.shape[-1])
    render, alpha = op(means, rot, scl, jnp.asarray(opacities, jnp.float32), chans, viewmat, bg)
    zero = jnp.zeros((), jnp.int32)
    return RenderOutput(
        rgb=render[..., :3], alpha=alpha, depth=render[..., -1],
        features=render[..., 3:-1] if features is not None else None,
        n_overflow_tiles=zero, n_dropped_pairs=zero, max_tile_count=zero - 1)


__all__ = ["UNAVAILABLE", "covariance_from_quat_scale", "gsplat_available", "rasterize_gsplat"]
