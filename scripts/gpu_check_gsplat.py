#!/usr/bin/env python3
"""GPU check: gsplat backend vs the JAX tile rasteriser on the render-std scene.

Run on a CUDA machine with torch + gsplat + CUDA JAX:
    python scripts/gpu_check_gsplat.py --out gsplat_check.json
Writes JSON: device info, image agreement (mean / max abs RGB and alpha difference), gradient
agreement (cosine similarity of d(L1)/d(means, colours, opacities)), forward and
forward+backward medians for both backends (eager for gsplat, jitted for JAX).
Exits 2 with one line on stderr where gsplat/CUDA is missing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def _median_ms(fn, repeats=20):
    import jax

    jax.block_until_ready(fn())
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t)
    return 1e3 * statistics.median(ts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gsplat_check.json")
    ap.add_argument("--capacity", type=int, default=160)
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp

    from realsim_core.bench import render_std_scene
    from realsim_core.render import rasterize
    from realsim_core.render.gsplat_backend import UNAVAILABLE, gsplat_available

    if not gsplat_available():
        print(f"gpu_check_gsplat: {UNAVAILABLE}", file=sys.stderr)
        return 2
    params, intr, pose = render_std_scene()
    p = {k: jnp.asarray(v) for k, v in params.items()}
    pose = jnp.asarray(pose)
    target = jnp.full((intr.height, intr.width, 3), 0.5, jnp.float32)

    def render(diff, backend):
        return rasterize(diff["means"], p["quats"], p["scales"], diff["opacities"],
                         diff["colors"], pose, intr, sh_degree=0, backend=backend,
                         capacity=args.capacity)

    def loss(diff, backend):
        return jnp.mean(jnp.abs(render(diff, backend).rgb - target))

    diff = {k: p[k] for k in ("means", "colors", "opacities")}
    out = {"device": str(jax.devices()[0]), "jax": jax.__version__}
    try:
        import gsplat
        import torch

        out.update(torch=torch.__version__, gsplat=gsplat.__version__,
                   gpu=torch.cuda.get_device_name())
    except Exception as exc:  # noqa: BLE001
        out["version_error"] = repr(exc)

    a = render(diff, "jax")
    b = render(diff, "gsplat")
    out["jax_overflow_tiles"] = int(a.n_overflow_tiles)
    out["rgb_mean_abs_diff"] = float(jnp.abs(a.rgb - b.rgb).mean())
    out["rgb_max_abs_diff"] = float(jnp.abs(a.rgb - b.rgb).max())
    out["alpha_mean_abs_diff"] = float(jnp.abs(a.alpha - b.alpha).mean())
    ga = jax.grad(loss)(diff, "jax")
    gb = jax.grad(loss)(diff, "gsplat")
    for k in diff:
        x, y = ga[k].ravel(), gb[k].ravel()
        out[f"grad_cosine_{k}"] = float(x @ y / (jnp.linalg.norm(x) * jnp.linalg.norm(y) + 1e-30))

    fwd_jax = jax.jit(lambda d: render(d, "jax").rgb)
    bwd_jax = jax.jit(jax.grad(lambda d: loss(d, "jax")))
    t = time.perf_counter()
    jax.block_until_ready(bwd_jax(diff))
    out["jax_compile_fwd_bwd_s"] = time.perf_counter() - t
    out["jax_forward_ms"] = _median_ms(lambda: fwd_jax(diff))
    out["jax_fwd_bwd_ms"] = _median_ms(lambda: bwd_jax(diff))
    out["gsplat_forward_ms"] = _median_ms(lambda: render(diff, "gsplat").rgb)
    out["gsplat_fwd_bwd_ms"] = _median_ms(lambda: jax.grad(loss)(diff, "gsplat"))
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=2)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
