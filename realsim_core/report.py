"""`report.html` of an offline calibration: loss curves, residuals and overlays, errors."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import jax
import numpy as np


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _render_all(session, params, frame: int, level: int):
    from realsim_core.calibration import render_batch

    fn = jax.jit(lambda p, q, c: render_batch(session.static, p, q, c, level))
    return [np.asarray(x[0]) for x in fn(params, session.bufs.q[frame][None],
                                        params["corrections"][frame][None])]


def residual_figures(session, start_params, frame: int | None = None) -> list[str]:
    """Per camera: observed, overlay and |residual| at the start poses and calibrated.

    Both renders use the fitted appearance, so the difference is the geometry alone.
    Returns PNG data URIs.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    level = len(session.cfg.levels) - 1
    if frame is None:
        hold = np.flatnonzero(np.asarray(session.bufs.holdout))
        frame = int(hold[0]) if hold.size else 0
    # the start poses rendered with the fitted appearance: shows misalignment, not colour
    from realsim_core.calibration import POSE_KEYS

    start = {**session.accepted, **{k: start_params[k] for k in POSE_KEYS}}
    before = _render_all(session, start, frame, level)
    after = _render_all(session, session.accepted, frame, level)
    figs = []
    for c, cam in enumerate(session.cameras):
        if float(session.bufs.valid[frame, c]) == 0:
            continue
        obs = np.asarray(session.bufs.images[level][c][frame])
        fig, ax = plt.subplots(1, 5, figsize=(16, 2.6))
        panels = [
            (obs, "observed"),
            (0.5 * obs + 0.5 * before[c], "overlay, start"),
            (0.5 * obs + 0.5 * after[c], "overlay, calibrated"),
            (np.abs(before[c] - obs).mean(-1), "|residual|, start"),
            (np.abs(after[c] - obs).mean(-1), "|residual|, calibrated"),
        ]
        vmax = max(float(panels[3][0].max()), 1e-3)
        for a, (img, title) in zip(ax, panels):
            if img.ndim == 2:
                a.imshow(img, cmap="magma", vmin=0, vmax=vmax)
            else:
                a.imshow(np.clip(img, 0, 1))
            a.set_title(f"{cam}: {title}", fontsize=8)
            a.axis("off")
        figs.append(_png(fig))
    return figs


def loss_figure(history) -> str:
    """Training loss and held-out L1 against steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    if history:
        h = np.asarray([[s, loss, hold] for s, loss, hold in history], float)
        ax.plot(h[:, 0], h[:, 1], "o-", label="training loss (last step)")
        ax.plot(h[:, 0], h[:, 2], "s-", label="held-out L1 (accepted)")
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _png(fig)


def write_report(path: str | Path, session, start_params, metrics: dict) -> None:
    """Write a self-contained HTML report (images embedded)."""
    rows = "".join(
        f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(_fmt(v))}</td></tr>"
        for k, v in metrics.items()
        if k not in ("history", "judgements", "evaluation", "evaluation_nominal",
                     "evaluation_table", "evaluation_table_nominal", "edge_distance_px_start",
                     "edge_distance_px"))
    parts = [
        "<!doctype html><meta charset='utf-8'><title>realsim calibration report</title>",
        "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}"
        "td{padding:2px 8px}img{max-width:100%}</style>",
        "<h1>realsim calibration report</h1>",
        f"<table>{rows}</table>",
        "<h2>Loss</h2>", f"<img src='{loss_figure(metrics.get('history', []))}'>",
    ]
    if metrics.get("judgements"):
        cells = "".join(
            f"<tr><td>{html.escape(str(j['estimate']))}</td><td>{j['step']}</td>"
            f"<td>{j['holdout_l1']:.5f}</td><td>{'painted' if j.get('painted') else 'fitted'}"
            f"</td><td>{'accepted' if j['accepted'] else 'rejected'}</td></tr>"
            for j in metrics["judgements"])
        parts += ["<h2>Acceptance tests</h2>",
                  "<p>Each estimate is compared with the accepted one on the held-out frames "
                  "(photometric L1 with each estimate's fitted colours, or with colours "
                  "painted from the training frames at its poses); a rejected estimate is "
                  "discarded.</p>",
                  "<table><tr><th>estimate</th><th>step</th><th>held-out L1</th>"
                  "<th>colours</th><th>verdict</th></tr>", cells, "</table>"]
        cfg = metrics.get("config", {})
        tol = cfg.get("repaint_tolerance", 0.0)
        if tol:
            parts.append(f"<p>A repaint pass is accepted when its held-out score is within "
                         f"{100 * tol:g} % of the lowest one accepted so far "
                         "(repaint_tolerance), its fitted L1 never above the start's.</p>")
        if metrics.get("repaints_skipped"):
            gain = cfg.get("repaint_min_gain", 0.0)
            parts.append(f"<p>{metrics['repaints_skipped']} repaint pass(es) not run: the "
                         f"last pass lowered the held-out L1 by less than {100 * gain:g} % "
                         "(repaint_min_gain).</p>")
    if "evaluation_table" in metrics:
        parts += ["<h2>Against ground truth</h2><h3>start (nominal)</h3><pre>",
                  html.escape(metrics["evaluation_table_nominal"]),
                  "</pre><h3>calibrated</h3><pre>",
                  html.escape(metrics["evaluation_table"]), "</pre>"]
    if "edge_distance_px" in metrics:
        start = metrics.get("edge_distance_px_start", {})
        cells = "".join(
            f"<tr><td>{html.escape(c)}</td><td>{_px(start.get(c))}</td><td>{_px(v)}</td></tr>"
            for c, v in metrics["edge_distance_px"].items())
        parts += ["<h2>Geometry check (appearance-free)</h2>",
                  "<p>Mean distance in pixels of each camera's rendered robot outline to the "
                  "nearest edge of its held-out images (capped; lower is better; blank: the "
                  "camera sees no robot). It does not depend on the fitted colours.</p>",
                  "<table><tr><th>camera</th><th>start</th><th>calibrated</th></tr>",
                  cells, "</table>"]
    parts.append("<h2>Residuals and overlays (a held-out frame, finest level)</h2>")
    parts += [f"<img src='{uri}'>" for uri in residual_figures(session, start_params)]
    Path(path).write_text("\n".join(parts))


def _px(v) -> str:
    return "" if v is None else f"{v:.3f}"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.5g}"
    return str(v)


__all__ = ["write_report", "residual_figures", "loss_figure"]
