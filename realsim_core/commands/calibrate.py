"""`realsim calibrate BAG --out DIR`: offline calibration of a recording."""

from __future__ import annotations

import math

from realsim_core.errors import RealsimError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "calibrate", help="calibrate cameras and joint offsets from a rosbag2 recording",
        description="Run the calibration engine on a rosbag2 recording (or a realsim synth "
                    "folder) and write calibration.yaml, metrics.json and report.html.")
    p.add_argument("bag", help="rosbag2 folder, or a `realsim synth` output folder")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--rig", help="rig file (default: rig.yaml beside the bag)")
    p.add_argument("--steps", type=float, default=1.0, metavar="SCALE",
                   help="scale of the default step schedule (default 1.0)")
    p.add_argument("--time-budget", type=float, metavar="S",
                   help="stop the schedule after S seconds (the best estimate so far is kept)")
    p.add_argument("--max-frames", type=int, default=48, help="frames used (evenly spread)")
    p.add_argument("--gaussians", type=int, default=8000,
                   help="Gaussians on the known scene (robot, table)")
    p.add_argument("--levels", default="2,1",
                   help="image pyramid factors, coarse to fine (default 2,1)")
    p.add_argument("--flat-levels", type=int, default=1, metavar="N",
                   help="the first N levels render one colour per link side, so the colours "
                        "cannot absorb a misregistration (default 1; never the last level)")
    p.add_argument("--plane-edges", choices=("hard", "textured", "soft", "repaint"),
                   default="repaint",
                   help="outline of the table top: hard (no pose gradient), soft "
                        "(anti-aliased, its edge pulls the camera poses), textured (soft after "
                        "the flat levels), repaint (hard at the levels, soft in the repaint "
                        "passes; default); see docs/calibration.md")
    p.add_argument("--textured-start", choices=("paint", "flat"), default="paint",
                   help="colours of the first level after the flat ones: painted afresh from "
                        "the images at the flat level's estimate (default), or the flat "
                        "colours spread to every Gaussian")
    p.add_argument("--repaint-passes", type=int, default=3, metavar="N",
                   help="after the schedule, repaint the colours at the estimate and run the "
                        "last level again, up to N times (default 3; each pass is ~1/5 of "
                        "the run's time; 2 is ~20%% faster; no pass follows one that lowered "
                        "the held-out L1 by < 0.5%%, --set repaint_min_gain=0 runs all N; see "
                        "docs/calibration.md)")
    p.add_argument("--wrist-weight", type=float, default=0.3, metavar="W",
                   help="weight of the wrist cameras' images in pose steps, fixed cameras "
                        "1.0 (default 0.3; the paper's 0.1 measured worse offline, see "
                        "docs/calibration.md)")
    p.add_argument("--set", dest="settings", action="append", default=[],
                   metavar="NAME=VALUE",
                   help="set any calibration setting (a CalibrationConfig field, e.g. "
                        "wrist_weight=0.3 or cycles_per_level=30,10), or with the prefix "
                        "object. any object setting (an ObjectConfig field, e.g. "
                        "object.shared_cameras=false), applied after the options above; "
                        "repeatable; metrics.json lists the settings used")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--objects", dest="objects", action="store_true",
                   help="also reconstruct unknown objects (meshes under OUT/meshes/)")
    p.add_argument("--no-objects", dest="objects", action="store_false")
    p.add_argument("--object-steps", type=int, metavar="N",
                   help="Adam steps per object (default 600)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress output (a bar on a terminal, else a line every 30 s)")
    p.set_defaults(func=run, objects=False)


def run(args) -> int:
    from realsim_core.offline import OfflineOptions, calibrate_bag, calibration_config

    if args.object_steps is not None and args.object_steps < 1:
        raise RealsimError("--object-steps must be >= 1")
    try:
        levels = tuple(int(x) for x in args.levels.split(","))
    except ValueError:
        raise RealsimError(f"--levels must be comma-separated integers, got {args.levels!r}") \
            from None
    if not levels or any(v < 1 for v in levels):
        raise RealsimError("--levels must be integers >= 1")
    if args.flat_levels < 0:
        raise RealsimError("--flat-levels must be >= 0")
    if args.steps <= 0 or (args.time_budget is not None and args.time_budget <= 0):
        raise RealsimError("--steps and --time-budget must be > 0")
    if args.repaint_passes < 0:
        raise RealsimError("--repaint-passes must be >= 0")
    if not (math.isfinite(args.wrist_weight) and args.wrist_weight >= 0):
        raise RealsimError("--wrist-weight must be a number >= 0")
    settings, object_settings = [], []
    for item in args.settings:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key or key == "object.":
            raise RealsimError(f"--set wants NAME=VALUE, got {item!r}")
        if key.startswith("object."):
            object_settings.append((key[len("object."):], value))
        else:
            settings.append((key, value))
    from realsim_core.objects import ObjectConfig

    ObjectConfig().with_overrides(object_settings)   # a bad setting fails before loading
    if object_settings and not args.objects:
        raise RealsimError("--set object.* applies to --objects, which is not given")
    opts = OfflineOptions(rig=args.rig, max_frames=args.max_frames, n_gaussians=args.gaussians,
                          time_budget_s=args.time_budget, steps_scale=args.steps, levels=levels,
                          flat_levels=args.flat_levels, plane_edges=args.plane_edges,
                          repaint_passes=args.repaint_passes,
                          textured_start=args.textured_start,
                          wrist_weight=args.wrist_weight, settings=tuple(settings),
                          seed=args.seed, progress=not args.no_progress,
                          objects=args.objects, object_steps=args.object_steps,
                          object_settings=tuple(object_settings))
    calibration_config(opts)                         # ... checked as the run will use it
    m = calibrate_bag(args.bag, args.out, opts)
    print(f"calibrated {m['frames']} frames in {m['wall_s']:.1f} s ({m['steps']} steps); "
          f"held-out L1 {m['holdout_l1_start']:.4f} -> {m['holdout_l1']:.4f}")
    if m.get("judgements"):
        print(judgement_line(m["judgements"], m.get("camera_reverts", 0),
                             m.get("repaints_skipped", 0),
                             m.get("config", {}).get("repaint_min_gain")))
    start = m.get("edge_distance_px_start", {})
    seen = [(c, start.get(c), v) for c, v in m.get("edge_distance_px", {}).items()
            if v is not None and start.get(c) is not None]
    if seen:
        print("outline-to-edge distance [px], start -> calibrated: "
              + ", ".join(f"{c} {a:.3f} -> {b:.3f}" for c, a, b in seen))
    if "evaluation_table" in m:
        print(m["evaluation_table"])
    print(f"wrote {args.out}/calibration.yaml, metrics.json, report.html")
    return 0 if math.isfinite(m["holdout_l1"]) else 1


def judgement_line(judgements: list[dict], camera_reverts: int = 0, repaints_skipped: int = 0,
                   min_gain: float | None = None) -> str:
    """One line: each estimate's held-out L1 and whether it replaced the accepted one.

    "(painted)" marks a test of painted colours (CalibrationConfig.repaint_acceptance);
    `repaints_skipped` passes were not run (CalibrationConfig.repaint_min_gain = `min_gain`).
    """
    from realsim_core.offline import format_judgement

    parts = [format_judgement(j["estimate"], j["step"], j["holdout_l1"], j["accepted"],
                              bool(j.get("painted"))) for j in judgements]
    n_rej = sum(not j["accepted"] for j in judgements)
    line = "held-out test (lower is better): " + ", ".join(parts)
    if n_rej:
        line += f"; {n_rej} rejected estimate(s) discarded, the result is the last accepted one"
    if repaints_skipped:
        why = f" (< {100 * min_gain:g} %)" if min_gain else ""
        line += (f"; {repaints_skipped} repaint pass(es) skipped: the last one lowered the "
                 f"held-out L1 too little{why}")
    if camera_reverts:
        line += f"; camera guard kept {camera_reverts} camera pose(s) at the accepted estimate"
    return line
