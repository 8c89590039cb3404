"""Standard benchmarks (`realsim bench`): a registry of name -> function returning metrics.

Add a benchmark with `@register("name", "one-line description")` on a function
`fn(quick: bool) -> dict[str, float | int | str]`; `realsim bench --only name` runs one.
Scenes are defined in docs/contracts.md ("Standard benchmark scenes").
"""

from __future__ import annotations

import platform
import resource
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np


class Benchmark(NamedTuple):
    name: str
    description: str
    fn: Callable[[bool], dict]


BENCHMARKS: dict[str, Benchmark] = {}


def register(name: str, description: str):
    """Decorator adding `fn(quick) -> dict` to the registry under `name`."""

    def deco(fn):
        BENCHMARKS[name] = Benchmark(name, description, fn)
        return fn

    return deco


def machine_info() -> dict:
    import os

    import jax

    return {
        "machine": platform.node(),
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "date": time.strftime("%Y-%m-%d"),
    }


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (ru_maxrss, Linux KiB -> MiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _times_ms(fn, repeats: int) -> tuple[float, float]:
    """(median, min) wall time of `fn()` in ms.

    The min is the least disturbed run on a shared machine; the median is the contract's.
    """
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times), 1e3 * min(times)


def render_std_scene(seed: int = 0, n: int = 20_000, width: int = 424, height: int = 240):
    """The render-std scene (contracts.md): Gaussians on a 0.3 m sphere shell 0.6 m ahead.

    Returns (params dict of numpy float32 arrays: means [N,3] m, quats [N,4] xyzw,
    scales [N,3] m, opacities [N], colors [N,1,3] SH0), intrinsics, cam_pose [4,4].
    """
    from realsim_core.render.sh import rgb_to_sh0
    from realsim_core.types import CameraIntrinsics

    rng = np.random.default_rng(seed)
    d = rng.normal(size=(n, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    means = d * 0.3 + np.array([0.0, 0.0, 0.6])
    params = {
        "means": means.astype(np.float32),
        "quats": np.tile(np.array([0.0, 0.0, 0.0, 1.0], np.float32), (n, 1)),
        "scales": np.full((n, 3), 0.003, np.float32),
        "opacities": np.full((n,), 0.8, np.float32),
        "colors": rgb_to_sh0(rng.uniform(0.0, 1.0, (n, 1, 3))).astype(np.float32),
    }
    f = 0.9 * width
    intr = CameraIntrinsics(width, height, f, f, (width - 1) / 2.0, (height - 1) / 2.0)
    return params, intr, np.eye(4, dtype=np.float32)


@register("render-std", "20k Gaussians, 424x240, forward and forward+backward (L1)")
def bench_render_std(quick: bool = False, tile_size: int = 8, capacity: int = 64) -> dict:
    import jax
    import jax.numpy as jnp

    from realsim_core.render import rasterize
    from realsim_core.se3 import se3_exp

    params, intr, pose0 = render_std_scene()
    p = {k: jnp.asarray(v) for k, v in params.items()}
    pose0 = jnp.asarray(pose0)
    target = jnp.full((intr.height, intr.width, 3), 0.5, jnp.float32)
    opts = dict(sh_degree=0, tile_size=tile_size, capacity=capacity)

    def render(p, xi):
        pose = pose0 @ se3_exp(xi)
        return rasterize(p["means"], p["quats"], p["scales"], p["opacities"], p["colors"],
                         pose, intr, **opts)

    @jax.jit
    def forward(p, xi):
        out = render(p, xi)
        return out.rgb, out.n_overflow_tiles, out.max_tile_count

    def loss(diff, fixed, xi):
        out = render({**fixed, **diff}, xi)
        return jnp.mean(jnp.abs(out.rgb - target))

    @jax.jit
    def fwd_bwd(p, xi):
        diff = {k: p[k] for k in ("means", "colors", "opacities")}
        fixed = {k: p[k] for k in ("quats", "scales")}
        return jax.value_and_grad(loss, argnums=(0, 2))(diff, fixed, xi)

    xi = jnp.zeros(6, jnp.float32)
    rss0 = peak_rss_mb()
    t = time.perf_counter()
    fwd_c = forward.lower(p, xi).compile()
    compile_fwd = time.perf_counter() - t
    t = time.perf_counter()
    bwd_c = fwd_bwd.lower(p, xi).compile()
    compile_bwd = time.perf_counter() - t
    mem = bwd_c.memory_analysis()
    rgb, n_over, max_count = jax.block_until_ready(fwd_c(p, xi))
    jax.block_until_ready(bwd_c(p, xi))
    repeats = 3 if quick else 10
    fwd_ms, fwd_min = _times_ms(lambda: jax.block_until_ready(fwd_c(p, xi)), repeats)
    bwd_ms, bwd_min = _times_ms(lambda: jax.block_until_ready(bwd_c(p, xi)), repeats)
    res = {
        "gaussians": int(params["means"].shape[0]),
        "resolution": f"{intr.width}x{intr.height}",
        "tile_size": tile_size,
        "capacity": capacity,
        "forward_ms": round(fwd_ms, 1),
        "fwd_bwd_ms": round(bwd_ms, 1),
        "forward_min_ms": round(fwd_min, 1),
        "fwd_bwd_min_ms": round(bwd_min, 1),
        "compile_s": round(compile_fwd + compile_bwd, 2),
        "overflow_tiles": int(n_over),
        "max_tile_count": int(max_count),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "peak_rss_growth_mb": round(peak_rss_mb() - rss0, 1),
    }
    if mem is not None:
        res["fwd_bwd_temp_mb"] = round(mem.temp_size_in_bytes / 2**20, 1)
    return res


CALIB_STD_SYNTH = dict(seed=0, frames=40, joint_offset_std=0.02, camera_offset_mm=10.0,
                       camera_offset_deg=1.0, resolution=(212, 120))
CALIB_STD_BUDGET_S = 300.0


@register("calib-std", "synth 40 frames 212x120 (0.02 rad, 10 mm / 1 deg), calibrate 300 s")
def bench_calib_std(quick: bool = False, workdir: str | None = None) -> dict:
    """Time to TCP < 2 mm and every camera < 2 mm / 0.1 deg, and the final errors.

    The estimate is scored against the ground truth after every cycle (scoring time is
    excluded from the clock). `quick` shortens the recording and the budget (smoke test).
    """
    import tempfile
    import time
    from pathlib import Path

    from realsim_core.calibration_io import read_ground_truth
    from realsim_core.evaluate import evaluate
    from realsim_core.offline import OfflineOptions, load_session
    from realsim_core.synth import SynthConfig, synthesize

    cfg = dict(CALIB_STD_SYNTH)
    budget = CALIB_STD_BUDGET_S
    if quick:
        cfg.update(frames=8, resolution=(106, 60))
        budget = 60.0
    tmp = tempfile.TemporaryDirectory() if workdir is None else None
    root = Path(workdir or tmp.name)
    rec = root / "calib-std"
    if not (rec / "ground_truth.yaml").exists():
        synthesize(rec, SynthConfig(**cfg, objects=0))
    gt = read_ground_truth(rec / "ground_truth.yaml")
    t0 = time.monotonic()
    session, _, _ = load_session(rec, OfflineOptions(progress=False))
    paused = 0.0
    reached = None
    res: dict = {}

    def score(params):
        ev = evaluate(session.estimate_from(params), gt)
        cams = ev.cameras.values()
        return (ev.tcp_mm, max(c.translation_mm for c in cams),
                max(c.rotation_deg for c in cams))

    tcp0, t_err0, r_err0 = score(session.params)

    def monitor(_metrics):  # after every cycle: score the current (not yet accepted) estimate
        nonlocal paused, reached
        ts = time.monotonic()
        tcp, t_err, r_err = score(session.params)
        paused += time.monotonic() - ts
        if reached is None and tcp < 2.0 and t_err < 2.0 and r_err < 0.1:
            reached = time.monotonic() - t0 - paused

    session.run(time_budget_s=budget, callback=monitor)
    tcp, t_err, r_err = score(session.accepted)
    res.update({
        "tcp_start_mm": round(tcp0, 3), "tcp_final_mm": round(tcp, 3),
        "camera_trans_start_mm": round(t_err0, 3), "camera_trans_final_mm": round(t_err, 3),
        "camera_rot_start_deg": round(r_err0, 4), "camera_rot_final_deg": round(r_err, 4),
        "time_to_target_s": None if reached is None else round(reached, 1),
        "wall_s": round(time.monotonic() - t0 - paused, 1),
        "steps": session.metrics.steps,
    })
    if tmp is not None:
        tmp.cleanup()
    return res


def run_benchmarks(names: list[str] | None = None, quick: bool = False) -> dict[str, dict]:
    """Run the named benchmarks (all when None); returns {name: metrics}."""
    names = list(BENCHMARKS) if not names else names
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise KeyError(f"unknown benchmark(s): {', '.join(unknown)}; "
                       f"known: {', '.join(BENCHMARKS)}")
    return {n: BENCHMARKS[n].fn(quick) for n in names}
