"""`realsim synth OUT ...`: render a synthetic ALOHA 2 recording with exact ground truth."""

from __future__ import annotations

import sys

from realsim_core.errors import RealsimError


def _resolution(text: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise RealsimError(f"--resolution must look like 424x240, got '{text}'") from None
    return w, h


def _bump(text: str) -> tuple[str, float, float, float]:
    parts = text.split(":")
    try:
        if len(parts) != 4:
            raise ValueError
        return parts[0], float(parts[1]), float(parts[2]), float(parts[3])
    except ValueError:
        raise RealsimError(f"--bump must look like cam_high:0.5:10:1 (CAMERA:T_FRAC:MM:DEG), "
                           f"got '{text}'") from None


def add_parser(sub) -> None:
    p = sub.add_parser(
        "synth", help="render a ground-truth recording (rosbag2 + rig.yaml + ground_truth.yaml)",
        description="Render a synthetic recording of the rig with MuJoCo's renderer, with known "
                    "joint offsets, camera offsets and objects.")
    p.add_argument("out", help="output folder (created; must be empty or absent)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--frames", type=int, default=40, help="image frames at 5 Hz (default 40)")
    p.add_argument("--joint-offset-std", type=float, default=0.02, metavar="RAD",
                   help="std of the true joint offsets, rad (gripper: x0.1 m/rad; default 0.02)")
    p.add_argument("--joint-noise-std", type=float, default=0.0, metavar="RAD",
                   help="per-sample joint measurement noise, rad (default 0)")
    p.add_argument("--camera-offset-mm", type=float, default=10.0, metavar="MM",
                   help="true camera translation offset, exact length in mm (default 10)")
    p.add_argument("--camera-offset-deg", type=float, default=1.0, metavar="DEG",
                   help="true camera rotation offset, exact angle in deg (default 1)")
    p.add_argument("--objects", type=int, default=4, help="objects on the table (default 4)")
    p.add_argument("--resolution", default="424x240", metavar="WxH",
                   help="image size (default 424x240)")
    p.add_argument("--rig", default=None, help="rig file (default builtin:aloha2)")
    p.add_argument("--bump", action="append", default=[], metavar="CAMERA:T_FRAC:MM:DEG",
                   help="move CAMERA by exactly MM mm / DEG deg (random directions) from "
                        "the fraction T_FRAC of the recording on; ground_truth.yaml then "
                        "describes the final pose (repeatable)")
    p.add_argument("--object-masks", action="store_true",
                   help="also write /<cam>/object_mask (mono8 instance labels, object i -> "
                        "i + 1) from MuJoCo's segmentation")
    p.set_defaults(func=run)


def run(args) -> int:
    from realsim_core.synth import SynthConfig, synthesize

    cfg = SynthConfig(
        seed=args.seed, frames=args.frames, joint_offset_std=args.joint_offset_std,
        joint_noise_std=args.joint_noise_std, camera_offset_mm=args.camera_offset_mm,
        camera_offset_deg=args.camera_offset_deg, objects=args.objects,
        resolution=_resolution(args.resolution), rig=args.rig,
        bumps=tuple(_bump(b) for b in args.bump), object_masks=args.object_masks,
    )
    tty = sys.stderr.isatty()

    def progress(f: int) -> None:
        if tty:
            print(f"\rrendering frame {f + 1}/{cfg.frames}", end="", file=sys.stderr, flush=True)

    res = synthesize(args.out, cfg, progress=progress)
    if tty:
        print(file=sys.stderr)
    print(f"wrote {res.out_dir} (bag: {res.bag.name}/, rig.yaml, ground_truth.yaml) in "
          f"{res.seconds_total:.1f} s (rendering {res.seconds_render:.1f} s)")
    return 0
