"""Unknown objects -> metric meshes with Gaussian appearance (paper 4.2-5.3, app. B.2).

Per object: an icosphere (642 vertices; by default its radius is 1.15 x the median over
the masks of their largest projected extent, `fit_to_masks`; else 5 cm) is placed at the
least-squares intersection of the camera rays through the object's mask centroids, then
a global translation, a global log-scale (our addition: shrinks/grows the sphere in a few
steps instead of hundreds of per-vertex moves), per-vertex deltas (connectivity fixed)
and the SplatMesh Gaussians (`render/splatmesh.py`, one free part per object) are
optimised with Adam (optax), jointly with small se(3) deltas of every camera
(right-applied, optical frame, Gaussian prior). Adam moves u with deltas =
(I + lambda L)^-1 u (`smooth_lambda`, Nicolet et al. 2021 "large steps"): smooth steps, no
loss term. Optionally (`antialiased`, off by default) renders use the rasterizer's
Mip-Splatting opacity compensation, so surfels seen edge-on do not widen the silhouette;
it also fades sub-pixel surfels, which hurt the coarse rig views (docs/objects.md).

Losses (weights in `ObjectConfig`, defaults documented in docs/objects.md):
- photometric: L1 between the render (black background) and the masked observation;
- hard mask: L2 between the rendered alpha and the mask;
- soft mask: the same squared difference weighted by (EDT / soft_mask_px)^2, EDT the
  Euclidean distance (pixels) to the mask boundary on either side
  (`scipy.ndimage.distance_transform_edt`), so a silhouette far from the mask still gets
  a gradient that grows with the distance (paper's "L2 against the squared EDT");
- normal consistency (optional, when views carry normal images): L2 between rendered
  camera-frame normals and the given ones;
- Laplacian smoothing: mean over vertices of |d_i - mean of its neighbours' d_j|^2 (mm^2)
  of the per-vertex deltas d (the paper's eq. 5 on the deformation rather than on the
  positions: the absolute form also penalises the sphere's own curvature, which grows
  with the global scale and biases every object towards shrinking);
- edge length: variance of the edge lengths (mm^2).

Views are warped once into per-object *virtual cameras*: same centre, rotated to look at
the object, square `crop_px` images, each with the focal length at which the object fills
its crop (`zoom_views`: a far view is upsampled instead of leaving the object on a few
tiles, where the rasteriser's per-tile capacity keeps only the nearest Gaussians). A
rotation about the centre is an exact homography, so nothing is approximated, and every
view of an object shares one static `CameraIntrinsics` (one compile, a vmapped batch of
views): a view's own focal is applied by scaling the Gaussians in its camera frame.

Static model vs dynamic state (style.md): `_Static` (faces, edges, SplatMesh structure,
virtual-view images/masks/EDTs, intrinsics) is closed over; the step is a pure jitted
function of (params, optimiser state, view indices).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from realsim_core.errors import RealsimError
from realsim_core.types import CameraIntrinsics


# ----------------------------------------------------------------------------- config
@dataclass(frozen=True)
class ObjectConfig:
    """Hyper-parameters of object reconstruction (defaults: docs/objects.md)."""

    steps: int = 600                  # Adam steps per object
    batch_views: int = 4              # views rendered per step
    crop_px: int = 96                 # virtual view size (square)
    max_views: int = 32               # views kept per object (most informative first)
    subdivisions: int = 3             # icosphere: 3 -> 642 vertices, 1280 faces
    init_radius_m: float = 0.05       # icosphere radius (when not fit_to_masks)
    fit_to_masks: bool = True         # radius (and view crop) from the masks' extent instead
    fit_margin: float = 1.15          # ... x the masks' projected extent (fit_quantile)
    fit_quantile: float = 0.5         # ... this quantile of the per-view extents (1: max)
    mean_per_face: float = 2.0        # Gaussians per face (paper 12; CPU budget here)
    min_per_face: int = 1
    max_per_face: int = 8
    gauss_scale_init: float = 0.5     # x splatmesh's initial in-plane std (0.5 x spacing)
    gauss_follow_scale: bool = True   # Gaussian scales x exp(global log-scale) (see docs)
    gauss_scale_max: float | None = None  # in-plane std <= this x splatmesh's initial std
    clamp_opacity: bool = True        # opacity 1 for every Gaussian (paper B.2.2)
    surfel: bool = True               # normal scale = float32 eps (False: learned)
    antialiased: bool = False         # rasterizer opacity compensation (Mip-Splatting):
    #                                   no silhouette bias, but fades sub-pixel surfels
    filter_px2: float = 0.1           # rasterizer low-pass (px^2 added to every 2D
    #                                   covariance) at the source images' pixel scale ...
    filter_follow_zoom: bool = True   # ... x max(1, s)^2, s = the median over the views
    #                                   of virtual px per source px (coarse sources seen
    #                                   upsampled want a wider filter; docs/objects.md)
    refine_cameras: bool = True
    shared_cameras: bool = True       # session objects: fit each object, fix every camera
    #                                   at the median of the objects' deltas, fit again
    #                                   (rig views: median CD 14.6 -> 11.9 mm^2 at the true
    #                                   calibration, 16.8 -> 13.8 with cameras 2-3 mm off;
    #                                   no gain at 212x120, docs/objects.md "Session 15");
    #                                   twice the fit time
    occlusion: bool = True            # session objects: pixels where the robot or another
    #                                   object may hide this one are left out of the losses
    zoom_views: bool = True           # per-view focal length: the object fills every crop
    #                                   (False: one focal for all views, <= the native one)
    # loss weights
    w_photo: float = 1.0
    w_mask: float = 1.0
    w_smask: float = 0.05
    soft_mask_px: float = 8.0         # EDT distance (virtual px) with weight 1
    w_normal: float = 0.0             # only used when views carry normals
    w_laplacian: float = 0.0          # per mm^2 (1.0 before: too stiff, docs/objects.md)
    laplacian_final: float = 1.0      # Laplacian weight at the last step, x w_laplacian
    w_edge: float = 0.01              # per mm^2
    support_z: float | None = None    # world z of the plane the object rests on (the table
    #                                   top; reconstruct_session_objects sets it from the
    #                                   rig): vertices below it are rendered and exported
    #                                   on it (the table cuts the mesh; None: off)
    w_camera_prior: float = 1e-3
    prior_camera_m: float = 0.005     # 1-sigma of the camera deltas
    prior_camera_rad: float = 0.01
    # Adam learning rates (cosine decay to 10 % over the run)
    lr_translation: float = 2e-3      # m
    lr_scale: float = 2e-2            # global log-scale of the icosphere (fast shrink/grow)
    lr_vertices: float = 5e-4         # m
    lr_gaussians: float = 1e-2        # logits / log-scales / SH
    lr_camera: float = 1e-4           # se(3) units (m, rad)
    tile_size: int = 8
    capacity: int = 128               # Gaussians per tile (64 overflowed on most tiles)
    smooth_lambda: float = 3.0        # vertex deltas = (I + lambda L)^-1 u (0: u itself)
    seed: int = 0

    def replace(self, **kw) -> ObjectConfig:
        return dataclasses.replace(self, **kw)

    def with_overrides(self, pairs) -> ObjectConfig:
        """A copy with fields set from (name, text) pairs (`realsim calibrate --set object.*`)."""
        from realsim_core.settings import with_overrides

        return with_overrides(self, pairs, ("support_z", "gauss_scale_max"), "object setting")


class View(NamedTuple):
    """One observation of the scene by one camera.

    image: [H, W, 3] uint8 (or float in [0, 1]); T_world_cam: [4, 4] optical frame in world
    (m); intrinsics: pinhole (pixels); camera: index of the physical camera (views of one
    camera share one extrinsic delta); mask: [H, W] bool of *this object* (set per object);
    normals: optional [H, W, 3] unit camera-frame normals (for the normal loss);
    occluder_depth: optional [H, W] optical-frame depth (m) of what else is known to be in
    the scene (the robot, other objects; inf: nothing). Pixels outside the mask where it
    is nearer than the object's centre are left out of the losses: there the object may
    be hidden, so "not in the mask" says nothing about its shape.
    """

    image: np.ndarray
    T_world_cam: np.ndarray
    intrinsics: CameraIntrinsics
    camera: int = 0
    mask: np.ndarray | None = None
    normals: np.ndarray | None = None
    occluder_depth: np.ndarray | None = None


@dataclass
class ObjectResult:
    """A reconstructed object (world frame, metres)."""

    name: str
    vertices: np.ndarray          # [V, 3] world
    faces: np.ndarray             # [F, 3]
    face_colors: np.ndarray       # [F, 3] in [0, 1] (mean colour of each face's Gaussians)
    gaussians: dict               # world Gaussians: means, covars, opacities, sh (numpy)
    camera_deltas: np.ndarray     # [C, 6] se(3) (rho, phi) right-applied
    init_vertices: np.ndarray     # [V, 3] the starting icosphere (world)
    history: list                 # (step, loss) pairs
    seconds: float
    n_views: int
    cameras: tuple = ()           # camera indices of the views the fit used


# ----------------------------------------------------------------------------- geometry
def icosphere(subdivisions: int = 3, radius: float = 0.05):
    """Trimesh icosphere -> (vertices [V, 3] m, faces [F, 3]); 3 -> 642 vertices."""
    import trimesh

    m = trimesh.creation.icosphere(subdivisions=subdivisions, radius=radius)
    return np.asarray(m.vertices, np.float64), np.asarray(m.faces, np.int64)


def mesh_edges(faces: np.ndarray) -> np.ndarray:
    """Unique undirected edges [E, 2] (i < j) of a triangle mesh faces [F, 3]."""
    f = np.asarray(faces, np.int64)
    e = np.concatenate([f[:, [0, 1]], f[:, [1, 2]], f[:, [2, 0]]])
    e = np.sort(e, axis=1)
    return np.unique(e, axis=0)


def laplacian_loss(vertices, edges: np.ndarray, n_vertices: int):
    """Mean over vertices of |v_i - mean_{j in N(i)} v_j|^2 (units of vertices squared).

    vertices: [V, 3]; edges: [E, 2] unique undirected edges. Paper eq. (5), averaged.
    """
    e = jnp.asarray(edges)
    nb_sum = jnp.zeros_like(vertices).at[e[:, 0]].add(vertices[e[:, 1]])
    nb_sum = nb_sum.at[e[:, 1]].add(vertices[e[:, 0]])
    deg = np.bincount(np.asarray(edges).ravel(), minlength=n_vertices).astype(np.float64)
    deg = jnp.asarray(np.maximum(deg, 1.0), vertices.dtype)[:, None]
    d = vertices - nb_sum / deg
    return jnp.mean(jnp.sum(d * d, axis=-1))


def edge_length_loss(vertices, edges: np.ndarray):
    """Variance of the edge lengths (units of vertices squared): even triangles."""
    e = jnp.asarray(edges)
    ln = jnp.linalg.norm(vertices[e[:, 0]] - vertices[e[:, 1]], axis=-1)
    return jnp.mean((ln - jnp.mean(ln)) ** 2)


def boundary_edt(mask: np.ndarray) -> np.ndarray:
    """Distance (pixels) of every pixel to the mask boundary, on either side: [H, W]."""
    from scipy.ndimage import distance_transform_edt

    m = np.asarray(mask, bool)
    if not m.any() or m.all():
        return np.full(m.shape, float(max(m.shape)))
    return distance_transform_edt(~m) + distance_transform_edt(m)


def mask_losses(alpha, mask, edt, valid, soft_mask_px: float):
    """(hard, soft) mask losses of rendered alpha [..., H, W] vs mask [..., H, W] in [0, 1].

    edt: boundary distance (px), valid: [..., H, W] weights. Means over valid pixels.
    """
    sq = (alpha - mask) ** 2
    w = jnp.maximum(jnp.sum(valid), 1.0)
    hard = jnp.sum(sq * valid) / w
    soft = jnp.sum(sq * (edt / soft_mask_px) ** 2 * valid) / w
    return hard, soft


def triangulate_rays(origins: np.ndarray, directions: np.ndarray) -> np.ndarray:
    """Least-squares point closest to rays o_i + t d_i: [N, 3], [N, 3] -> [3] (float64).

    Minimises sum_i |(I - d_i d_i^T)(x - o_i)|^2. Raises RealsimError for < 2 rays or
    (nearly) parallel rays.
    """
    o = np.asarray(origins, np.float64).reshape(-1, 3)
    d = np.asarray(directions, np.float64).reshape(-1, 3)
    if len(o) < 2:
        raise RealsimError("triangulation needs the object in at least 2 views")
    d = d / np.linalg.norm(d, axis=1, keepdims=True)
    P = np.eye(3)[None] - d[:, :, None] * d[:, None, :]
    A = P.sum(0)
    b = np.einsum("nij,nj->i", P, o)
    if np.linalg.cond(A) > 1e8:
        raise RealsimError("triangulation is degenerate (parallel rays)")
    return np.linalg.solve(A, b)


def pixel_ray(T_world_cam: np.ndarray, intr: CameraIntrinsics, uv) -> tuple:
    """World ray (origin [3], unit direction [3]) through pixel uv = (u, v)."""
    d_cam = np.array([(uv[0] - intr.cx) / intr.fx, (uv[1] - intr.cy) / intr.fy, 1.0])
    d = np.asarray(T_world_cam, np.float64)[:3, :3] @ d_cam
    return np.asarray(T_world_cam, np.float64)[:3, 3].copy(), d / np.linalg.norm(d)


def mask_centroid(mask: np.ndarray):
    """(u, v) centroid of a mask [H, W] (pixels) or None when empty."""
    vs, us = np.nonzero(mask)
    if len(us) == 0:
        return None
    return np.array([us.mean(), vs.mean()])


def triangulate_mask_centroids(views: list[View]) -> np.ndarray:
    """Object centre [3] (world, m) from the rays through its mask centroids."""
    rays = [pixel_ray(v.T_world_cam, v.intrinsics, c)
            for v in views if (c := mask_centroid(v.mask)) is not None]
    if len(rays) < 2:
        raise RealsimError("object seen in fewer than 2 views: cannot place it")
    o, d = map(np.stack, zip(*rays))
    return triangulate_rays(o, d)


# ----------------------------------------------------------------------------- virtual views
def look_at_rotation(direction_cam: np.ndarray) -> np.ndarray:
    """Rotation R_cam_virtual [3, 3] whose z axis is `direction_cam` (y kept near y)."""
    z = np.asarray(direction_cam, np.float64)
    z = z / np.linalg.norm(z)
    y = np.array([0.0, 1.0, 0.0]) - z[1] * z
    if np.linalg.norm(y) < 1e-6:
        y = np.array([1.0, 0.0, 0.0]) - z[0] * z
    y /= np.linalg.norm(y)
    x = np.cross(y, z)
    return np.stack([x, y, z], axis=1)


def warp_to_virtual(img: np.ndarray, intr: CameraIntrinsics, R_cv: np.ndarray,
                    vintr: CameraIntrinsics, order: int = 1):
    """Resample img [H, W, C] into a virtual camera rotated by R_cv about the same centre.

    Returns (warped [S, S, C] float, inside [S, S] bool: the ray hits the source image).
    Downsampling is pre-filtered with a Gaussian (sigma 0.5 / scale px).
    """
    from scipy.ndimage import gaussian_filter, map_coordinates

    img = np.asarray(img, np.float64)
    if img.ndim == 2:
        img = img[..., None]
    scale = vintr.fx / intr.fx
    if scale < 0.99:
        sig = 0.5 / scale
        img = gaussian_filter(img, (sig, sig, 0))
    v, u = np.mgrid[0:vintr.height, 0:vintr.width].astype(np.float64)
    d = np.stack([(u - vintr.cx) / vintr.fx, (v - vintr.cy) / vintr.fy, np.ones_like(u)], -1)
    d = d @ R_cv.T
    ok = d[..., 2] > 1e-6
    z = np.where(ok, d[..., 2], 1.0)
    us = intr.fx * d[..., 0] / z + intr.cx
    vs = intr.fy * d[..., 1] / z + intr.cy
    inside = ok & (us >= -0.5) & (us <= intr.width - 0.5) & (vs >= -0.5) & (vs <= intr.height - 0.5)
    out = np.stack([map_coordinates(img[..., c], [vs, us], order=order, mode="nearest")
                    for c in range(img.shape[-1])], -1)
    return out, inside


class _Static(NamedTuple):
    """Frozen per-object data (closed over by the jitted step)."""

    model: object                 # SplatMeshModel
    base_vertices: np.ndarray     # [V, 3] icosphere, object frame
    edges: np.ndarray             # [E, 2]
    intr: CameraIntrinsics        # virtual intrinsics (shared by all views; focal f_ref)
    T_cam0: jnp.ndarray           # [N, 4, 4] T_world_cam (starting estimate)
    R_cv: jnp.ndarray             # [N, 4, 4] T_cam_virtual (pure rotation)
    cam_index: jnp.ndarray        # [N] physical camera of each view
    images: jnp.ndarray           # [N, S, S, 3] masked observation (0 outside the mask)
    masks: jnp.ndarray            # [N, S, S] in [0, 1]
    edt: jnp.ndarray              # [N, S, S] px
    valid: jnp.ndarray            # [N, S, S] inside the source image
    normals: jnp.ndarray | None   # [N, S, S, 3] camera-frame normals or None
    n_cameras: int
    log_scale_max: jnp.ndarray | None = None  # [G, 2] upper bound of params["log_scales"]
    smooth: jnp.ndarray | None = None  # [V, V] (I + lambda L)^-1: deltas = smooth @ u
    zoom: jnp.ndarray | None = None  # [N] focal of each view / intr's (None: all 1)
    filter_px2: float = 0.1       # the rasteriser's low-pass for these views (px^2)


def _select_views(views: list[View], max_views: int, view_spacing_m: float = 0.1) -> list[View]:
    """Keep up to max_views views with the object, as many distinct viewpoints as possible.

    Greedy farthest-point selection from the view with the largest mask: the next view is
    the one farthest from every kept one, distance = camera-centre distance + view_spacing_m
    x the angle (rad) between the optical axes, times min(1, mask area / median area) so
    that slivers at the image border are not picked for their position alone. A static
    camera repeats one viewpoint in every frame: its copies (distance 0) come last, the
    larger (less occluded) masks first.
    """
    seen = [v for v in views if v.mask is not None and np.any(v.mask)]
    if len(seen) <= max_views:
        return seen
    area = np.array([np.count_nonzero(v.mask) for v in seen], np.float64)
    centre = np.stack([np.asarray(v.T_world_cam, np.float64)[:3, 3] for v in seen])
    axis = np.stack([np.asarray(v.T_world_cam, np.float64)[:3, 2] for v in seen])
    weight = np.minimum(1.0, area / np.median(area))
    first = int(np.argmax(area))
    kept = [first]
    dmin = np.full(len(seen), np.inf)
    while len(kept) < max_views:
        j = kept[-1]
        ang = np.arccos(np.clip(axis @ axis[j], -1.0, 1.0))
        dmin = np.minimum(dmin, np.linalg.norm(centre - centre[j], axis=1)
                          + view_spacing_m * ang)
        score = dmin * weight + 1e-9 * area      # ties (duplicates): larger mask first
        score[kept] = -np.inf
        kept.append(int(np.argmax(score)))
    return [seen[i] for i in kept]


def mask_extent_radius(views: list[View], centre: np.ndarray, quantile: float = 1.0) -> float:
    """Largest distance (m) of a mask pixel from the projected `centre`, over the views.

    Each view gives the object's extent perpendicular to its ray (pixels x depth / f); the
    maximum over views approximates the radius of the object's bounding sphere at centre.
    quantile < 1: that quantile of the per-view extents instead of their maximum (robust
    to a few views with a stray mask or a poorly placed centre).
    """
    rs = [0.0]
    for v in views:
        p = v.T_world_cam[:3, :3].T @ (centre - v.T_world_cam[:3, 3])
        if p[2] <= 1e-6:
            continue
        u0 = v.intrinsics.fx * p[0] / p[2] + v.intrinsics.cx
        w0 = v.intrinsics.fy * p[1] / p[2] + v.intrinsics.cy
        ws, us = np.nonzero(v.mask)
        if len(us) == 0:
            continue
        px = float(np.sqrt(np.max((us - u0) ** 2 + (ws - w0) ** 2))) + 0.5
        rs.append(px * float(np.linalg.norm(p)) / v.intrinsics.fx)
    return float(np.quantile(rs[1:], quantile)) if len(rs) > 1 else 0.0


def prepare_views(views: list[View], centre: np.ndarray, cfg: ObjectConfig,
                  radius: float | None = None):
    """Virtual views of one object around `centre` -> (_Static fields dict, vintr).

    radius: the starting icosphere's radius (m; default cfg.init_radius_m). With
    `cfg.zoom_views` every view gets its own focal length, so that a sphere of
    r_fit = max(radius, 1.3 x the masks' equivalent radius) fills 90 % of its crop (a far
    view is upsampled rather than left with the object on a few tiles, where the
    rasteriser's per-tile capacity cuts off all but the nearest Gaussians); `vintr` then
    has the median focal and `fields["zoom"]` [N] each view's focal / that one. Without
    it, one focal length, <= the native one, keeps r_fit inside 90 % of the nearest view.
    """
    S = cfg.crop_px
    radius = cfg.init_radius_m if radius is None else radius
    # object size from the masks: equivalent radius (px) * depth / f
    dists, radii = [], []
    for v in views:
        p = v.T_world_cam[:3, :3].T @ (centre - v.T_world_cam[:3, 3])
        dists.append(float(np.linalg.norm(p)))
        area = float(np.count_nonzero(v.mask))
        radii.append(math.sqrt(area / math.pi) * dists[-1] / v.intrinsics.fx)
    r_obj = float(np.median(radii))
    r_fit = max(radius, 1.3 * r_obj)
    c = (S - 1) / 2.0
    if cfg.zoom_views:
        focal = 0.9 * (S / 2) * np.asarray(dists) / r_fit
        f = float(np.median(focal))
    else:
        f = min(min(v.intrinsics.fx for v in views), 0.9 * (S / 2) * min(dists) / r_fit)
        focal = np.full(len(views), f)
    vintr = CameraIntrinsics(S, S, f, f, c, c)
    imgs, masks, edts, valid, Tc, Rv, cams, norms = [], [], [], [], [], [], [], []
    for v, fv in zip(views, focal):
        intr = v.intrinsics
        vi = CameraIntrinsics(S, S, float(fv), float(fv), c, c)
        p = v.T_world_cam[:3, :3].T @ (centre - v.T_world_cam[:3, 3])
        R = look_at_rotation(p)
        img = np.asarray(v.image, np.float64)
        if img.max() > 1.5:
            img = img / 255.0
        m = np.asarray(v.mask, np.float64)
        wimg, inside = warp_to_virtual(img * m[..., None], intr, R, vi)
        wm, _ = warp_to_virtual(m, intr, R, vi)
        wm = np.clip(wm[..., 0], 0.0, 1.0)
        imgs.append(wimg)
        masks.append(wm)
        edts.append(boundary_edt(wm > 0.5))
        ok = inside.astype(np.float64)
        if v.occluder_depth is not None:   # may be hidden there: no evidence either way
            hidden = ((np.asarray(v.occluder_depth) < p[2]) & (m < 0.5)).astype(np.float64)
            wh, _ = warp_to_virtual(hidden, intr, R, vi)
            ok = ok * (1.0 - np.clip(wh[..., 0], 0.0, 1.0))
        valid.append(ok)
        T = np.eye(4)
        T[:3, :3] = R
        Tc.append(np.asarray(v.T_world_cam, np.float64))
        Rv.append(T)
        cams.append(v.camera)
        if v.normals is not None:
            wn, _ = warp_to_virtual(v.normals, intr, R, vi)
            norms.append(wn @ R)  # camera frame -> virtual camera frame
    f32 = functools.partial(jnp.asarray, dtype=jnp.float32)
    fields = dict(
        T_cam0=f32(np.stack(Tc)), R_cv=f32(np.stack(Rv)),
        cam_index=jnp.asarray(cams, jnp.int32), images=f32(np.stack(imgs)),
        masks=f32(np.stack(masks)), edt=f32(np.stack(edts)), valid=f32(np.stack(valid)),
        normals=f32(np.stack(norms)) if len(norms) == len(views) else None,
        zoom=f32(focal / f) if cfg.zoom_views else None,
        filter_px2=view_filter_px2(cfg, np.asarray(focal) / np.array(
            [v.intrinsics.fx for v in views])))
    return fields, vintr


def view_filter_px2(cfg: ObjectConfig, px_per_source_px: np.ndarray) -> float:
    """The rasteriser's low-pass (px^2) for one object's views (`cfg.filter_px2` x ...).

    The views are magnified `px_per_source_px` [N] times from their source images; the
    filter is `cfg.filter_px2` x max(1, median s)^2.

    Sharp sources (object-centric: s ~ 0.3-0.5) get the narrow filter, which keeps the
    surfels' rims from widening the silhouette; coarse rig images seen upsampled
    (s ~ 1.6-2.7 at 212x120) get a wider one, as their observations are blurred over s
    virtual pixels. One value per object (the rasteriser's filter is static); a per-view
    filter was measured worse (docs/objects.md).
    """
    s = np.asarray(px_per_source_px, np.float64)
    if not cfg.filter_follow_zoom or s.size == 0:
        return float(cfg.filter_px2)
    return float(cfg.filter_px2) * max(1.0, float(np.median(s))) ** 2


# ----------------------------------------------------------------------------- model
def _init(views: list[View], cfg: ObjectConfig, name: str, n_cameras: int):
    from realsim_core.render.splatmesh import MeshPart, build_model

    centre = triangulate_mask_centroids(views)
    radius = cfg.init_radius_m
    if cfg.fit_to_masks:
        radius = cfg.fit_margin * mask_extent_radius(views, centre, cfg.fit_quantile)
    fields, vintr = prepare_views(views, centre, cfg, radius)
    base, faces = icosphere(cfg.subdivisions, radius)
    obs = np.concatenate([np.asarray(v.image, np.float64)[np.asarray(v.mask, bool)]
                          for v in views])
    rgb = np.clip(np.median(obs, 0) / (255.0 if obs.max() > 1.5 else 1.0), 0.02, 0.98)
    part = MeshPart(name, base, faces, 0, np.eye(4), rgb)
    model, sp = build_model([part], mean_per_face=cfg.mean_per_face, sh_degree=0,
                            seed=cfg.seed, min_per_face=cfg.min_per_face,
                            max_per_face=cfg.max_per_face)
    lmax = (None if cfg.gauss_scale_max is None
            else jnp.asarray(sp["log_scales"] + math.log(cfg.gauss_scale_max), jnp.float32))
    edges = mesh_edges(faces)
    smooth = None
    if cfg.smooth_lambda > 0:
        smooth = jnp.asarray(smoothing_operator(edges, len(base), cfg.smooth_lambda),
                             jnp.float32)
    static = _Static(model=model, base_vertices=base, edges=edges, intr=vintr,
                     n_cameras=n_cameras, log_scale_max=lmax, smooth=smooth, **fields)
    params = {
        "translation": jnp.asarray(centre, jnp.float32),
        "deltas": jnp.zeros(base.shape, jnp.float32),
        "log_scale": jnp.zeros((), jnp.float32),
        "bary_logits": sp["bary_logits"],
        "log_scales": sp["log_scales"] + math.log(cfg.gauss_scale_init), "sh": sp["sh"],
        "opacity_logits": sp["opacity_logits"],
        "cam_xi": jnp.zeros((n_cameras, 6), jnp.float32),
    }
    if not cfg.surfel:  # ablation: a learned normal scale, starting as thick as in-plane
        params["log_scale_normal"] = sp["log_scales"][:, 0] - math.log(2.0)
    return static, params


def smoothing_operator(edges: np.ndarray, n_vertices: int, lam: float) -> np.ndarray:
    """(I + lam L)^-1 [V, V] (float64), L = D - A the combinatorial graph Laplacian.

    Nicolet et al. 2021 ("Large steps in inverse rendering"): optimising u with
    deltas = (I + lam L)^-1 u keeps every shape reachable but makes gradient steps smooth
    (high-frequency components of a step are damped by 1 / (1 + lam mu)).
    """
    e = np.asarray(edges, np.int64)
    A = np.zeros((n_vertices, n_vertices))
    A[e[:, 0], e[:, 1]] = A[e[:, 1], e[:, 0]] = 1.0
    L = np.diag(A.sum(1)) - A
    return np.linalg.inv(np.eye(n_vertices) + lam * L)


def vertex_deltas(static: _Static, params):
    """[V, 3] per-vertex deltas (m): params["deltas"], smoothed when static.smooth is set."""
    u = params["deltas"]
    return u if static.smooth is None else static.smooth @ u


def object_vertices(static: _Static, params, support_z: float | None = None):
    """[V, 3] vertices in the object frame (m): exp(log_scale) * icosphere + deltas.

    support_z: world z of the plane the object rests on; vertices below it are moved onto
    it. The table hides what is below its top from every camera, so nothing else stops the
    mesh from growing into it (rig benchmark: the torus reached 32 mm below the table
    top, docs/objects.md). The cut has no gradient in z (the plane holds those vertices),
    and a penalty instead lifted the whole object (translation is the cheaper move).
    """
    base = jnp.asarray(static.base_vertices, jnp.float32)
    v = jnp.exp(params["log_scale"]) * base + vertex_deltas(static, params)
    if support_z is None:
        return v
    floor = jnp.asarray(support_z, v.dtype) - params["translation"][2]  # object frame
    return v.at[:, 2].set(jnp.maximum(v[:, 2], floor))


def object_gaussians(static: _Static, params, clamp_opacity: bool,
                     follow_scale: bool = False, support_z: float | None = None):
    """World Gaussians (splatmesh.WorldGaussians) of the object's current mesh.

    follow_scale: the Gaussians' log-scales are relative to the icosphere's global
    log-scale (they shrink and grow with the mesh instead of being relearned).
    support_z: the mesh is cut at this world z (`object_vertices`).
    """
    from realsim_core.render.splatmesh import gaussians_in_world

    sp = {k: params[k] for k in ("bary_logits", "log_scales", "sh", "opacity_logits")}
    if "log_scale_normal" in params:
        sp["log_scale_normal"] = params["log_scale_normal"]
    if follow_scale:
        sp["log_scales"] = sp["log_scales"] + params["log_scale"]
        if "log_scale_normal" in sp:
            sp["log_scale_normal"] = sp["log_scale_normal"] + params["log_scale"]
    sp["vertices"] = object_vertices(static, params, support_z)
    T = jnp.eye(4, dtype=jnp.float32).at[:3, 3].set(params["translation"])
    return gaussians_in_world(static.model, sp, T[None], clamp_opacity=clamp_opacity)


def view_poses(static: _Static, params, idx):
    """T_world_virtual [B, 4, 4] of views idx [B] with the current camera deltas."""
    from realsim_core.se3 import se3_exp

    xi = params["cam_xi"][static.cam_index[idx]]
    D = jax.vmap(se3_exp)(xi)
    return static.T_cam0[idx] @ D @ static.R_cv[idx]


def render_views(static: _Static, params, idx, cfg: ObjectConfig, intr=None):
    """Render views idx [B] -> (rgb [B, S, S, 3], alpha [B, S, S], normals [B, S, S, 3]).

    A view with zoom z (`static.zoom`) is rendered with focal z x intr's: the rasteriser's
    intrinsics are static, so the Gaussians are moved into the view's camera frame and
    scaled by diag(z, z, 1) there (means and covariances: u = f z x / z_c is exact, and so
    is the EWA Jacobian), then rendered from the identity pose.

    The rasteriser's low-pass is `static.filter_px2` (`view_filter_px2`).
    """
    g = object_gaussians(static, params, cfg.clamp_opacity, cfg.gauss_follow_scale,
                         cfg.support_z)
    poses = view_poses(static, params, idx)
    intr = static.intr if intr is None else intr
    zoom = (jnp.ones(idx.shape, g.means.dtype) if static.zoom is None
            else static.zoom[idx])
    return jax.vmap(lambda p, z: _render_gaussians(g, p, z, static.filter_px2, cfg, intr))(
        poses, zoom)


def _render_gaussians(g, pose, z, filter_px2: float, cfg: ObjectConfig,
                      intr: CameraIntrinsics):
    """One view of world Gaussians g: pose T_world_view [4, 4], zoom z (see render_views)."""
    from realsim_core.render import rasterize

    R = pose[:3, :3]
    n_cam = g.normals @ R  # world -> virtual camera frame
    s = jnp.stack([z, z, jnp.ones_like(z)])
    A = R * s[None, :]  # x_view = A^T (x_world - t)
    means = (g.means - pose[:3, 3]) @ A
    covars = jnp.swapaxes(A, 0, 1)[None] @ g.covars @ A[None]
    out = rasterize(means, None, None, g.opacities, g.sh, jnp.eye(4, dtype=g.means.dtype),
                    intr, covars=covars, sh_degree=0, features=n_cam,
                    background=jnp.zeros(3, g.means.dtype), tile_size=cfg.tile_size,
                    capacity=cfg.capacity, antialiased=cfg.antialiased,
                    filter_px2=filter_px2)
    return out.rgb, out.alpha, out.features


def loss_terms(static: _Static, params, idx, cfg: ObjectConfig) -> dict:
    """Every loss term (unweighted) for views idx [B]."""
    rgb, alpha, nrm = render_views(static, params, idx, cfg)
    valid = static.valid[idx]
    m = static.masks[idx]
    w = jnp.maximum(jnp.sum(valid), 1.0)
    photo = jnp.sum(jnp.mean(jnp.abs(rgb - static.images[idx]), -1) * valid) / w
    hard, soft = mask_losses(alpha, m, static.edt[idx], valid, cfg.soft_mask_px)
    v_mm = 1000.0 * object_vertices(static, params)
    n_v = static.base_vertices.shape[0]
    terms = {"photo": photo, "mask": hard, "smask": soft,
             "laplacian": laplacian_loss(1000.0 * vertex_deltas(static, params), static.edges, n_v),
             "edge": edge_length_loss(v_mm, static.edges)}
    if static.normals is not None:
        terms["normal"] = jnp.sum(jnp.sum((nrm - static.normals[idx] * alpha[..., None]) ** 2,
                                          -1) * m * valid) / w
    xi = params["cam_xi"]
    terms["camera_prior"] = 0.5 * (jnp.sum((xi[:, :3] / cfg.prior_camera_m) ** 2)
                                   + jnp.sum((xi[:, 3:] / cfg.prior_camera_rad) ** 2))
    return terms


_WEIGHTS = {"photo": "w_photo", "mask": "w_mask", "smask": "w_smask", "normal": "w_normal",
            "laplacian": "w_laplacian", "edge": "w_edge", "camera_prior": "w_camera_prior"}


def laplacian_weight(cfg: ObjectConfig, k):
    """Laplacian weight at step k: cosine from w_laplacian to laplacian_final x it."""
    t = jnp.clip(jnp.asarray(k, jnp.float32) / max(cfg.steps - 1, 1), 0.0, 1.0)
    f = cfg.laplacian_final + (1.0 - cfg.laplacian_final) * 0.5 * (1.0 + jnp.cos(jnp.pi * t))
    return cfg.w_laplacian * f


def total_loss(static: _Static, params, idx, cfg: ObjectConfig, k=0):
    """Weighted sum of `loss_terms` at step k (the Laplacian weight follows its schedule)."""
    terms = loss_terms(static, params, idx, cfg)
    w = {t: getattr(cfg, _WEIGHTS[t]) for t in terms}
    w["laplacian"] = laplacian_weight(cfg, k)
    return sum(w[t] * v for t, v in terms.items()), terms


def make_optimizer(cfg: ObjectConfig, params) -> optax.GradientTransformation:
    """Adam per parameter group (optax.multi_transform), cosine decay to 10 %."""
    def adam(lr):
        return optax.adam(optax.cosine_decay_schedule(lr, max(cfg.steps, 1), alpha=0.1))

    groups = {"translation": adam(cfg.lr_translation), "deltas": adam(cfg.lr_vertices),
              "scale": adam(cfg.lr_scale),
              "gauss": adam(cfg.lr_gaussians),
              "camera": adam(cfg.lr_camera) if cfg.refine_cameras else optax.set_to_zero()}
    special = {"translation": "translation", "deltas": "deltas", "log_scale": "scale",
               "cam_xi": "camera"}
    label = {k: special.get(k, "gauss") for k in params}
    return optax.multi_transform(groups, label)


def make_step(static: _Static, cfg: ObjectConfig, opt: optax.GradientTransformation):
    """Pure jitted step: (params, opt_state, idx [B], k) -> (params, opt_state, loss, terms).

    k: the step number (int32 scalar), for the Laplacian weight schedule.
    """
    def step(params, opt_state, idx, k):
        (loss, terms), grads = jax.value_and_grad(
            lambda p: total_loss(static, p, idx, cfg, k), has_aux=True)(params)
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(g))
                                    for g in jax.tree_util.tree_leaves(grads)]))
        updates, new_state = opt.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        if static.log_scale_max is not None:  # projected step: in-plane std <= its bound
            new_params = {**new_params, "log_scales": jnp.minimum(new_params["log_scales"],
                                                                  static.log_scale_max)}
        keep = lambda a, b: jax.tree_util.tree_map(  # noqa: E731
            lambda x, y: jnp.where(finite, x, y), a, b)
        return keep(new_params, params), keep(new_state, opt_state), loss, terms

    return jax.jit(step)


def reconstruct_object(views: list[View], cfg: ObjectConfig | None = None,
                       name: str = "object_0", n_cameras: int | None = None,
                       callback=None, camera_deltas: np.ndarray | None = None
                       ) -> ObjectResult:
    """Fit one object to the views whose `mask` marks it. Returns an `ObjectResult`.

    camera_deltas: [n_cameras, 6] starting se(3) deltas of the cameras (default zero);
    with `refine_cameras` off they stay there.
    """
    cfg = cfg or ObjectConfig()
    t0 = time.monotonic()
    views = _select_views(list(views), cfg.max_views)
    if len(views) < 2:
        raise RealsimError(f"{name}: seen in fewer than 2 views")
    n_cameras = n_cameras or (max(v.camera for v in views) + 1)
    static, params = _init(views, cfg, name, n_cameras)
    if camera_deltas is not None:
        xi = np.asarray(camera_deltas, np.float32)
        if xi.shape != params["cam_xi"].shape:
            raise RealsimError(f"{name}: camera_deltas has shape {xi.shape}, "
                               f"expected {tuple(params['cam_xi'].shape)}")
        params["cam_xi"] = jnp.asarray(xi)
    init_world = np.asarray(static.base_vertices) + np.asarray(params["translation"])
    opt = make_optimizer(cfg, params)
    state = opt.init(params)
    step = make_step(static, cfg, opt)
    rng = np.random.default_rng(cfg.seed)
    n = len(views)
    b = min(cfg.batch_views, n)
    history = []
    order = rng.permutation(n)
    pos = 0
    for k in range(cfg.steps):
        if pos + b > n:
            order, pos = rng.permutation(n), 0
        idx = jnp.asarray(order[pos:pos + b], jnp.int32)
        pos += b
        params, state, loss, terms = step(params, state, idx, jnp.asarray(k, jnp.int32))
        if k % 25 == 0 or k == cfg.steps - 1:
            history.append((k, float(loss)))
            if callback is not None:
                callback(k, float(loss), {t: float(v) for t, v in terms.items()})
    return _result(static, params, cfg, name, init_world, history, time.monotonic() - t0, n)


def _result(static, params, cfg, name, init_world, history, seconds, n_views) -> ObjectResult:
    from realsim_core.render.sh import SH_C0

    verts = (np.asarray(object_vertices(static, params, cfg.support_z), np.float64)
             + np.asarray(params["translation"], np.float64))
    g = object_gaussians(static, params, cfg.clamp_opacity, cfg.gauss_follow_scale,
                         cfg.support_z)
    faces = np.asarray(static.model.faces)
    col = np.clip(0.5 + SH_C0 * np.asarray(g.sh[:, 0], np.float64), 0.0, 1.0)
    gf = np.asarray(static.model.gauss_face)
    w = np.asarray(g.opacities, np.float64)
    acc = np.zeros((len(faces), 3))
    np.add.at(acc, gf, col * w[:, None])
    ws = np.bincount(gf, weights=w, minlength=len(faces))[:, None]
    face_col = np.where(ws > 0, acc / np.maximum(ws, 1e-12), col.mean(0))
    gauss = {k: np.asarray(getattr(g, k)) for k in ("means", "covars", "opacities", "sh")}
    return ObjectResult(name, verts, faces, face_col, gauss, np.asarray(params["cam_xi"]),
                        init_world, history, seconds, n_views,
                        tuple(sorted({int(c) for c in np.asarray(static.cam_index)})))


# ----------------------------------------------------------------------------- masks
@dataclass(frozen=True)
class MaskConfig:
    """Object masks from the residual |observation - calibrated render of the known scene|."""

    threshold: float = 0.12        # minimum residual (mean abs over RGB, 0-1)
    mad_k: float = 6.0             # robust threshold: median + k * 1.4826 MAD
    open_px: int = 1               # binary opening iterations (removes thin edge residuals)
    close_px: int = 2              # binary closing iterations
    min_area_px: int = 20          # smaller components are dropped (px at 212x120,
    #                                scaled with the image's pixel count)
    table_z: float = 0.0           # world z of the table top (rays are cut at table_z + lift)
    lift_m: float = 0.02
    cluster_m: float = 0.06        # components closer than this on the table are one object
    min_views: int = 3             # objects seen in fewer views are dropped
    min_cameras: int = 2           # ... or seen by fewer distinct cameras (a static
    #                                camera repeats its view every frame, so one camera's
    #                                persistent residual passes min_views on its own)
    min_seen_fraction: float = 0.3  # ... or found in fewer than this share of the views
    #                                whose image contains its centre (objects are static:
    #                                424x240 rig scene, true objects 0.66-1.0, misfit
    #                                residuals of the wrist views 0.02-0.08)
    workspace_xy: tuple = (-0.5, 0.5, -0.4, 0.4)  # xmin, xmax, ymin, ymax on the table


def residual_mask(observed: np.ndarray, rendered: np.ndarray, cfg: MaskConfig) -> np.ndarray:
    """Binary mask [H, W] of pixels the known scene does not explain (float images 0-1)."""
    from scipy import ndimage

    r = np.mean(np.abs(np.asarray(observed, np.float64) - np.asarray(rendered, np.float64)), -1)
    med = np.median(r)
    mad = 1.4826 * np.median(np.abs(r - med))
    m = r > max(cfg.threshold, med + cfg.mad_k * mad)
    if cfg.open_px:
        m = ndimage.binary_opening(m, iterations=cfg.open_px)
    if cfg.close_px:
        m = ndimage.binary_closing(m, iterations=cfg.close_px, border_value=0)
    m = ndimage.binary_fill_holes(m)
    lab, n = ndimage.label(m)
    if n:
        areas = ndimage.sum(m, lab, index=np.arange(1, n + 1))
        keep = np.zeros(n + 1, bool)
        keep[1:] = areas >= cfg.min_area_px * m.size / (212 * 120)
        m = keep[lab]
    return m


def split_objects(views: list[View], masks: list[np.ndarray], cfg: MaskConfig) -> list[list]:
    """Connected components of every view's mask -> objects (lists of per-view masks).

    Components seen steeply enough (ray z < -0.2) are placed on the table plane (ray
    through the centroid cut at table_z + lift_m) and clustered greedily within
    cluster_m; clusters seen in fewer than min_views views or outside the workspace are
    dropped. Then every component (shallow views too) is given to the objects whose
    centres project into it; one holding several is split by the nearest projected centre.
    A cluster placed from fewer than min_cameras distinct cameras gets a component only
    where no better-seen cluster claims it, and objects seen (after this pass) by fewer
    than min_cameras cameras are dropped: a persistent residual of one static camera
    passes min_views alone, and its centre may project into another camera's blob of a
    real object along a grazing ray. Objects found in fewer than min_seen_fraction of
    the views whose image contains their centre are dropped too (a table object is
    static; a residual of a misfit link comes and goes with the robot).
    Returns, per object, a list of [H, W] bool masks aligned with `views` (all False
    where the view misses it).
    """
    from scipy import ndimage

    comps = []  # (view index, component mask, xy on the table or None)
    for i, (v, m) in enumerate(zip(views, masks)):
        lab, n = ndimage.label(m)
        for k in range(1, n + 1):
            cm = lab == k
            o, d = pixel_ray(v.T_world_cam, v.intrinsics, mask_centroid(cm))
            xy = None
            if d[2] < -0.2:  # steep enough for a stable cut with the table plane
                t = (cfg.table_z + cfg.lift_m - o[2]) / d[2]
                xy = (o + t * d)[:2]
                x0, x1, y0, y1 = cfg.workspace_xy
                if not (x0 <= xy[0] <= x1 and y0 <= xy[1] <= y1):
                    continue
            comps.append((i, cm, xy))
    centres: list[np.ndarray] = []
    members: list[list] = []
    placed = [c for c in comps if c[2] is not None]
    for i, cm, xy in sorted(placed, key=lambda c: -int(c[1].sum())):
        dists = [np.linalg.norm(xy - c) for c in centres]
        if dists and min(dists) < cfg.cluster_m:
            j = int(np.argmin(dists))
            members[j].append((i, cm, xy))
            centres[j] = np.mean([x for _, _, x in members[j]], 0)
        else:
            centres.append(xy)
            members.append([(i, cm, xy)])
    keep = [k for k, mem in enumerate(members) if len({i for i, _, _ in mem}) >= cfg.min_views]
    strong = [len({views[i].camera for i, _, _ in members[k]}) >= cfg.min_cameras
              for k in keep]
    centres3 = [np.r_[np.mean([x for _, _, x in members[k]], 0), cfg.table_z + cfg.lift_m]
                for k in keep]
    per_obj = [[np.zeros(np.asarray(v.image).shape[:2], bool) for v in views] for _ in keep]
    # second pass: every component goes to the objects whose centres project into it; a
    # component holding several (objects touching in this view) is split by nearest centre
    for i, cm, xy in comps:
        inside = []
        for k, c in enumerate(centres3):
            uv = _project(views[i], c)
            if uv is None:
                continue
            u, w = uv
            ui, wi = int(round(u)), int(round(w))
            if 0 <= wi < cm.shape[0] and 0 <= ui < cm.shape[1] and near(cm, wi, ui):
                inside.append((k, u, w))
        if any(strong[k] for k, _, _ in inside):
            inside = [x for x in inside if strong[x[0]]]
        if len(inside) >= 2:
            vs, us = np.nonzero(cm)
            d = np.stack([(us - u) ** 2 + (vs - w) ** 2 for _, u, w in inside])
            owner = np.argmin(d, 0)
            for j, (k, _, _) in enumerate(inside):
                per_obj[k][i][vs[owner == j], us[owner == j]] = True
        elif xy is None:  # shallow ray: the object whose centre projects into it
            if inside:
                per_obj[inside[0][0]][i] |= cm
        else:
            dists = [np.linalg.norm(xy - c[:2]) for c in centres3]
            if dists and min(dists) < cfg.cluster_m:
                per_obj[int(np.argmin(dists))][i] |= cm
    seen_by = [len({views[i].camera for i, m in enumerate(per_obj[k]) if m.any()})
               for k in range(len(keep))]
    seen = [sum(bool(m.any()) for m in per_obj[k]) for k in range(len(keep))]
    could = [sum(_in_image(v, _project(v, centres3[k])) for v in views)
             for k in range(len(keep))]
    order = sorted((k for k in range(len(keep)) if seen_by[k] >= cfg.min_cameras
                    and seen[k] >= cfg.min_seen_fraction * could[k]),
                   key=lambda k: (round(float(centres3[k][0]), 3),
                                  round(float(centres3[k][1]), 3)))
    return [per_obj[k] for k in order]


def _project(view: View, point: np.ndarray):
    """Pixel (u, v) of world `point` in `view`, or None behind the camera."""
    T = np.asarray(view.T_world_cam, np.float64)
    p = T[:3, :3].T @ (np.asarray(point, np.float64) - T[:3, 3])
    if p[2] <= 1e-6:
        return None
    it = view.intrinsics
    return it.fx * p[0] / p[2] + it.cx, it.fy * p[1] / p[2] + it.cy


def _in_image(view: View, uv) -> bool:
    return uv is not None and bool(0 <= uv[0] < view.intrinsics.width
                                   and 0 <= uv[1] < view.intrinsics.height)


def near(mask: np.ndarray, row: int, col: int, radius: int = 3) -> bool:
    """Whether mask has a pixel within `radius` (Chebyshev) of (row, col)."""
    r0, c0 = max(row - radius, 0), max(col - radius, 0)
    return bool(mask[r0:row + radius + 1, c0:col + radius + 1].any())


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two boolean masks (1.0 when both are empty)."""
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    u = np.count_nonzero(a | b)
    return 1.0 if u == 0 else float(np.count_nonzero(a & b) / u)


def reconstruct_objects(views: list[View], object_masks: list[list[np.ndarray]],
                        cfg: ObjectConfig | None = None, names: list[str] | None = None,
                        callback=None) -> list[ObjectResult]:
    """One SplatMesh per object: object_masks[k][i] is object k's mask in views[i].

    With `cfg.occlusion` the other objects' masks are occluders (`with_occluders`).
    """
    cfg = cfg or ObjectConfig()
    n_cam = max(v.camera for v in views) + 1
    out = []
    for k in range(len(object_masks)):
        name = names[k] if names else f"object_{k}"
        vs = object_views(views, object_masks, k, cfg.occlusion)
        out.append(reconstruct_object(vs, cfg, name, n_cam, callback))
    return out


def object_views(views: list[View], object_masks: list[list[np.ndarray | None]], k: int,
                 occlusion: bool = True, robot_depth: list[np.ndarray] | None = None
                 ) -> list[View]:
    """The views that see object k, with its mask and (`occlusion`) its occluders.

    Occluders: the other objects' masks and the robot's depth (`with_occluders`).
    """
    def as_bool(m, v):
        return np.zeros(v.image.shape[:2], bool) if m is None else np.asarray(m, bool)

    masks = [as_bool(m, v) for m, v in zip(object_masks[k], views)]
    if occlusion:
        others = [np.zeros_like(m) for m in masks]
        for j, om in enumerate(object_masks):
            if j != k:
                others = [o | as_bool(m, v) for o, m, v in zip(others, om, views)]
        src = with_occluders(views, masks, others, robot_depth)
    else:
        src = [v._replace(mask=m) for v, m in zip(views, masks)]
    return [v for v, m in zip(src, masks) if m.any()]


# ----------------------------------------------------------------------------- sessions
def session_views(session, params=None) -> tuple[list[View], list[int]]:
    """Full-resolution views of every buffered frame of a `CalibrationSession`.

    Camera poses come from the session's (accepted) estimate through MJX kinematics;
    views of one rig camera share its extrinsic delta. Returns (views, frame slot of each).
    """
    from realsim_core import kinematics

    params = session.accepted if params is None else params
    st = session.static
    li = int(np.argmin(session.cfg.levels))  # the finest pyramid level
    n = session.n_frames
    idx = jnp.arange(n, dtype=jnp.int32)
    poses = kinematics.forward_batch(st.km, session.bufs.q[idx], params["joint_offsets"],
                                     params["corrections"][idx], params["fixed_deltas"],
                                     params["mounted_deltas"])
    cams = np.asarray(poses.cameras, np.float64)
    valid = np.asarray(session.bufs.valid)
    views, slots = [], []
    for f in range(n):
        for c, _name in enumerate(session.cameras):
            if valid[f, c] == 0:
                continue
            img = np.asarray(session.bufs.images[li][c][f])
            views.append(View(img, cams[f, c], st.intrinsics[li][c], c))
            slots.append(f)
    return views, slots


def session_renders(session, params=None) -> list[np.ndarray]:
    """Calibrated renders of the known scene for every view of `session_views` (same order)."""
    from realsim_core.calibration import render_batch

    params = session.accepted if params is None else params
    li = int(np.argmin(session.cfg.levels))
    fn = jax.jit(lambda p, q, corr: render_batch(session.static, p, q, corr, li))
    valid = np.asarray(session.bufs.valid)
    out = []
    for f in range(session.n_frames):
        i = jnp.asarray([f], jnp.int32)
        r = fn(params, session.bufs.q[i], params["corrections"][i])
        for c in range(len(session.cameras)):
            if valid[f, c]:
                out.append(np.asarray(r[c][0], np.float64))
    return out


def session_occluder_depths(session, params=None) -> list[np.ndarray]:
    """Depth (m) of the known scene's Gaussians (the robot) per view of `session_views`.

    [H, W] optical-frame depth where the render covers the pixel (alpha > 0.5), inf
    elsewhere; the table and floor planes are not occluders (objects stand on them).
    """
    from realsim_core.calibration import render_batch

    params = session.accepted if params is None else params
    li = int(np.argmin(session.cfg.levels))
    fn = jax.jit(lambda p, q, corr: render_batch(session.static, p, q, corr, li, alpha=True))
    valid = np.asarray(session.bufs.valid)
    out = []
    for f in range(session.n_frames):
        i = jnp.asarray([f], jnp.int32)
        _, alphas, depths = fn(params, session.bufs.q[i], params["corrections"][i])
        for c in range(len(session.cameras)):
            if valid[f, c]:
                a, d = np.asarray(alphas[c][0]), np.asarray(depths[c][0], np.float64)
                out.append(np.where(a > 0.5, d, np.inf))
    return out


def with_occluders(views: list[View], masks: list[np.ndarray], others: list[np.ndarray],
                   robot_depth: list[np.ndarray] | None) -> list[View]:
    """Views of one object (mask set) whose `occluder_depth` marks what may hide it.

    robot_depth: per view (`session_occluder_depths`) or None; others: per view the union
    of the other objects' masks (depth 0: their pixels say nothing about this object).
    """
    out = []
    for i, (v, m) in enumerate(zip(views, masks)):
        d = (np.full(m.shape, np.inf) if robot_depth is None
             else np.asarray(robot_depth[i], np.float64))
        d = np.where(others[i] & ~np.asarray(m, bool), 0.0, d)
        out.append(v._replace(mask=m, occluder_depth=d))
    return out


def derive_masks(views: list[View], renders: list[np.ndarray],
                 cfg: MaskConfig | None = None) -> list[np.ndarray]:
    """Per view: pixels the calibrated known-scene render does not explain (`residual_mask`)."""
    cfg = cfg or MaskConfig()
    return [residual_mask(np.asarray(v.image, np.float64) / (255.0 if np.asarray(v.image).max()
                                                             > 1.5 else 1.0), r, cfg)
            for v, r in zip(views, renders)]


def masks_from_labels(labels: list[np.ndarray | None]) -> dict[int, list[np.ndarray]]:
    """Instance label images (mono8, 0 = background) -> {label: per-view bool masks}.

    A binary mask topic (0/255) gives one label (255): split it with `split_objects`.
    """
    ids = sorted({int(x) for lab in labels if lab is not None for x in np.unique(lab)} - {0})
    shape = next(lab.shape for lab in labels if lab is not None)
    return {k: [np.zeros(shape, bool) if lab is None else lab == k for lab in labels]
            for k in ids}


def support_plane_z(session, mask_cfg: MaskConfig | None = None) -> float:
    """World z of the table top that objects rest on (`ObjectConfig.support_z`).

    The highest upward-facing plane of the session's scene (`planes.find_planes`: the
    table top, not the floor), else `MaskConfig.table_z` (sessions without planes).
    """
    planes = getattr(session.static, "planes", None)
    if planes is not None and len(planes.origin):
        up = np.asarray(planes.normal)[:, 2] > 0.9
        if up.any():
            return float(np.max(np.asarray(planes.origin)[up, 2]))
    return (mask_cfg or MaskConfig()).table_z


def shared_camera_deltas(deltas: list[np.ndarray], seen: list[set], n_cameras: int
                         ) -> np.ndarray:
    """[n_cameras, 6] per-camera median of the objects' camera deltas (`shared_cameras`).

    deltas: per object [n_cameras, 6] (`ObjectResult.camera_deltas`); seen: per object the
    camera indices of its views (a camera an object did not see kept its start there and
    does not vote). A camera no object saw gets zero.
    """
    out = np.zeros((n_cameras, 6))
    for c in range(n_cameras):
        votes = [np.asarray(d, np.float64)[c] for d, s in zip(deltas, seen) if c in s]
        if votes:
            out[c] = np.median(np.stack(votes), axis=0)
    return out


def reconstruct_session_objects(session, out_dir, cfg: ObjectConfig | None = None,
                                mask_cfg: MaskConfig | None = None,
                                label_masks: list[np.ndarray | None] | None = None,
                                density: float = 500.0, log=None, progress=None):
    """Objects of a calibrated session -> exported meshes + `ObjectCalibration`s.

    label_masks: per view of `session_views` an instance label image (from the
    `/cam_*/object_mask` topic) or None; without them masks are derived from the residual
    to the calibrated render. Writes `out_dir/<name>.{obj,stl,xml}` and the textured OBJ.
    log(message): what was found and fitted; progress(fit, step, steps, loss): every 25
    steps of each fit (fit: the object's name, "<name> (shared cameras)" in the second
    fit). Returns (list of ObjectCalibration, list of ObjectResult, per-object masks).
    """
    from realsim_core.calibration_io import ObjectCalibration
    from realsim_core.export import export_object

    cfg = cfg or ObjectConfig()
    mask_cfg = mask_cfg or MaskConfig()
    if cfg.support_z is None:
        cfg = cfg.replace(support_z=support_plane_z(session, mask_cfg))
    views, _ = session_views(session)
    if label_masks is not None and any(m is not None for m in label_masks):
        by_label = masks_from_labels(label_masks)
        if list(by_label) == [255]:  # binary masks: split into objects
            objects = split_objects(views, by_label[255], mask_cfg)
        else:
            objects = [by_label[k] for k in by_label]
    else:
        objects = split_objects(views, derive_masks(views, session_renders(session)), mask_cfg)
    if log:
        log(f"{len(objects)} object(s) found in {len(views)} views")
    robot = session_occluder_depths(session) if cfg.occlusion else None
    n_cam = len(session.cameras)

    def steps_of(fit):
        if progress is None:
            return None
        return lambda k, loss, _terms: progress(fit, k + 1, cfg.steps, loss)

    fitted = []  # (name, views, result)
    for k in range(len(objects)):
        name = f"object_{k}"
        vs = object_views(views, objects, k, cfg.occlusion, robot)
        try:
            r = reconstruct_object(vs, cfg, name, n_cam, callback=steps_of(name))
        except RealsimError as exc:
            if log:
                log(f"{name}: skipped ({exc})")
            continue
        fitted.append((name, vs, r))
        if log:
            log(f"{name}: {r.n_views} views, {r.seconds:.0f} s")
    if cfg.shared_cameras and cfg.refine_cameras and len(fitted) > 1:
        xi = shared_camera_deltas([r.camera_deltas for _, _, r in fitted],
                                  [set(r.cameras) for _, _, r in fitted], n_cam)
        if log:
            log("cameras fixed at the objects' median deltas: "
                + ", ".join(f"{c} {1000 * np.linalg.norm(x[:3]):.1f} mm "
                            f"{np.degrees(np.linalg.norm(x[3:])):.2f} deg"
                            for c, x in zip(session.cameras, xi)))
        fixed = cfg.replace(refine_cameras=False)
        refits = []
        for name, vs, _ in fitted:
            r = reconstruct_object(vs, fixed, name, n_cam, camera_deltas=xi,
                                   callback=steps_of(f"{name} (shared cameras)"))
            refits.append((name, vs, r))
            if log:
                log(f"{name}: fitted again with the shared cameras, {r.seconds:.0f} s")
        fitted = refits
    calibs, results = [], []
    for name, _, r in fitted:
        try:
            e = export_object(out_dir, name, r.vertices, r.faces, r.face_colors, density)
        except RealsimError as exc:   # one bad mesh must not cost the others (or the run)
            if log:
                log(f"not exported: {exc}")
            continue
        calibs.append(ObjectCalibration(name, e.obj, e.pose))
        results.append(r)
    return calibs, results, objects
