"""`realsim evaluate CALIBRATION TRUTH [--json]`: score a calibration against ground truth."""

from __future__ import annotations

import json


def add_parser(sub) -> None:
    p = sub.add_parser(
        "evaluate", help="score a calibration.yaml against a synth ground_truth.yaml",
        description="Camera errors (mm, deg), joint offset errors (rad), TCP error (mm, mean "
                    "over the recording and both arms), Chamfer distance per object (mm^2).")
    p.add_argument("calibration", help="calibration.yaml to score")
    p.add_argument("truth", help="ground_truth.yaml written by `realsim synth`")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from realsim_core.evaluate import evaluate_files, format_report

    report = evaluate_files(args.calibration, args.truth)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(format_report(report))
    return 0
