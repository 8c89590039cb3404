"""Differentiable rig kinematics through MuJoCo MJX.

`forward(km, q_measured, joint_offsets, corrections, fixed_deltas, mounted_deltas)` is a
pure, jittable function returning world poses of every MJCF body, every rig camera's
REP-103 optical frame (z forward, x right, y down) and every arm's tool centre point.
`forward_batch` is its `vmap` over frames (shared offsets and deltas).

The static model is a frozen pytree `KinematicModel` (build it once with
`build_kinematic_model(rig, mj_model)`), passed explicitly, like MJX's `Model`:

- `q = q_measured + joint_offsets + corrections` ([J], rig order `rig.joint_names`,
  rad for hinges, m for slides) is mapped linearly to MuJoCo `qpos` (`qpos_base + A q`,
  see rig.py for couplings such as gripper -> two fingers);
- fixed camera c (mounted on the world frame): `T_world_opt = N_c @ exp(delta_c)`;
- mounted camera c (e.g. a wrist camera): `T_world_opt = T_world_mount @ N_c @ exp(delta_c)`,
  where `N_c` is the rig file's nominal pose and `exp` is `se3.se3_exp` (delta on the right).

`reference_forward` is the same computation with C MuJoCo in float64 (numpy); it is the
test oracle and what `evaluate`/`synth` use (no JIT compile needed there).
`reference_body_poses` gives the body poses of many frames that way; with
`assemble_batch` the calibration session computes every pose it needs without a
gradient (painting, held-out scores) on the host.
"""

from __future__ import annotations

import contextlib
import io
import sys
import warnings
from dataclasses import dataclass, field
from typing import NamedTuple

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from realsim_core.rig import Rig
from realsim_core.se3 import make_pose, se3_exp


@dataclass(frozen=True)
class JointLayout:
    """Linear map from rig joint values [J] to MuJoCo qpos [nq]: qpos = base + A @ q."""

    qpos_base: np.ndarray  # [nq] float64: model qpos0 with driven entries zeroed
    A: np.ndarray  # [nq, J] float64

    def qpos(self, q: np.ndarray) -> np.ndarray:
        """[..., J] -> [..., nq] (numpy or jax)."""
        return self.qpos_base + q @ self.A.T


def joint_layout(rig: Rig, model: mujoco.MjModel) -> JointLayout:
    """Build the joint map for `rig` on `model` (names were validated by `load_rig`)."""
    names = rig.joint_names
    A = np.zeros((model.nq, len(names)))
    base = np.array(model.qpos0, dtype=np.float64)
    j = 0
    for arm in rig.arms:
        for jm in arm.joints:
            for mj_name, s in zip(jm.mjcf, jm.scale):
                jid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, mj_name)
                adr = int(model.jnt_qposadr[jid])
                A[adr, j] = s
                base[adr] = 0.0
            j += 1
    return JointLayout(base, A)


def _body_id(model: mujoco.MjModel, name: str) -> int:
    return int(mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, name))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class KinematicModel:
    """Static kinematic model of a rig (a pytree; pass it to jitted functions as an argument).

    Array fields are float32 unless noted. J joints, Cf fixed cameras, Cw mounted cameras,
    A arms, C = Cf + Cw cameras in rig file order.
    """

    mjx_model: object  # mujoco.mjx.Model
    qpos_base: jax.Array  # [nq]
    joint_map: jax.Array  # [nq, J]
    dof_map: jax.Array  # [nv, J] d qvel / d q (the driven hinges and slides: joint_map's rows)
    fixed_nominal: jax.Array  # [Cf, 4, 4] T_world_optical (m)
    mounted_nominal: jax.Array  # [Cw, 4, 4] T_mount_optical (m)
    mounted_body: jax.Array  # [Cw] int32 body ids of the mounts
    tcp_body: jax.Array  # [A] int32
    tcp_offset: jax.Array  # [A, 3] m, in the tcp body frame
    joint_names: tuple[str, ...] = field(metadata=dict(static=True))
    camera_names: tuple[str, ...] = field(metadata=dict(static=True))  # rig order
    # rig camera order -> index into [fixed; mounted]
    camera_perm: tuple[int, ...] = field(metadata=dict(static=True))
    body_names: tuple[str, ...] = field(metadata=dict(static=True))


class RigPoses(NamedTuple):
    """Outputs of `forward` (add a leading [F] axis for `forward_batch`)."""

    bodies: jax.Array  # [nbody, 4, 4] T_world_body (m), MuJoCo body order (0 = world)
    cameras: jax.Array  # [C, 4, 4] T_world_optical (m), rig camera order
    tcp: jax.Array  # [A, 3] tool centre points in world (m), rig arm order


def _mjx():
    """`mujoco.mjx`, imported without its notes on stdout.

    mujoco-mjx prints "Failed to import warp: ..." to *stdout* when the optional Warp
    backend is missing (realsim does not use it). That broke the JSON of `realsim bench
    --json` for pipelines; the two known notes are dropped, anything else goes to stderr.
    """
    if "mujoco.mjx" in sys.modules:
        return sys.modules["mujoco.mjx"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        from mujoco import mjx
    for line in buf.getvalue().splitlines():
        if not line.startswith(("Failed to import warp:", "Failed to import mujoco_warp:")):
            print(line, file=sys.stderr)
    return mjx


def build_kinematic_model(rig: Rig, model: mujoco.MjModel) -> KinematicModel:
    """Compile the static model for `rig` on the MuJoCo model `model` (from `load_mjmodel`)."""
    mjx = _mjx()

    lay = joint_layout(rig, model)
    # rig joints drive hinges and slides only (load_rig checks): one qpos and one dof each
    dof_map = np.zeros((model.nv, len(rig.joint_names)))
    for jid in range(model.njnt):
        if int(model.jnt_type[jid]) in (int(mujoco.mjtJoint.mjJNT_HINGE),
                                        int(mujoco.mjtJoint.mjJNT_SLIDE)):
            dof_map[model.jnt_dofadr[jid]] = lay.A[model.jnt_qposadr[jid]]
    fixed = rig.fixed_cameras
    mounted = rig.mounted_cameras
    order = [c.name for c in fixed] + [c.name for c in mounted]
    f32 = jnp.float32

    def stack(cams):
        if not cams:
            return jnp.zeros((0, 4, 4), f32)
        return jnp.asarray(np.stack([c.nominal for c in cams]), f32)

    with warnings.catch_warnings():
        # put_model warns about meshes with large coplanar faces: a cost of MJX's collision
        # detection, which realsim never runs (forward kinematics only). A real-mesh rig
        # (gym-aloha's ViperX) printed five of these per model build.
        warnings.filterwarnings("ignore", message=r"Mesh .* has a coplanar face",
                                category=UserWarning)
        mjx_model = mjx.put_model(model)
    return KinematicModel(
        mjx_model=mjx_model,
        qpos_base=jnp.asarray(lay.qpos_base, f32),
        joint_map=jnp.asarray(lay.A, f32),
        dof_map=jnp.asarray(dof_map, f32),
        fixed_nominal=stack(fixed),
        mounted_nominal=stack(mounted),
        mounted_body=jnp.asarray([_body_id(model, c.mount) for c in mounted], jnp.int32),
        tcp_body=jnp.asarray([_body_id(model, a.tcp_body) for a in rig.arms], jnp.int32),
        tcp_offset=jnp.asarray([a.tcp_offset for a in rig.arms], f32).reshape(-1, 3),
        joint_names=rig.joint_names,
        camera_names=rig.camera_names,
        camera_perm=tuple(order.index(c) for c in rig.camera_names),
        body_names=tuple(model.body(i).name for i in range(model.nbody)),
    )


def body_poses(km: KinematicModel, q) -> jax.Array:
    """World poses [nbody, 4, 4] of every body at rig joints q [J] (MJX kinematics)."""
    mjx = _mjx()
    qpos = km.qpos_base + km.joint_map @ q
    m = km.mjx_model
    d = mjx.make_data(m).replace(qpos=qpos.astype(km.qpos_base.dtype))
    d = mjx.kinematics(m, d)
    return make_pose(d.xmat.reshape(-1, 3, 3), d.xpos)


def assemble(km: KinematicModel, bodies, fixed_deltas, mounted_deltas) -> RigPoses:
    """`RigPoses` of one frame from its body poses [nbody, 4, 4] and the camera deltas."""
    cams_fixed = km.fixed_nominal @ se3_exp(fixed_deltas)
    cams_mounted = bodies[km.mounted_body] @ km.mounted_nominal @ se3_exp(mounted_deltas)
    cams = jnp.concatenate([cams_fixed, cams_mounted], 0)[jnp.asarray(km.camera_perm, jnp.int32)]
    tb = bodies[km.tcp_body]
    tcp = tb[:, :3, 3] + jnp.einsum("aij,aj->ai", tb[:, :3, :3], km.tcp_offset)
    return RigPoses(bodies, cams, tcp)


def forward(km: KinematicModel, q_measured, joint_offsets, corrections, fixed_deltas,
            mounted_deltas) -> RigPoses:
    """World poses of bodies, camera optical frames and TCPs for one frame (pure, jittable).

    Args:
      km: static model from `build_kinematic_model`.
      q_measured: [J] joint values as measured (rad; m for slides), rig order.
      joint_offsets: [J] constant offsets added to the measurement (same units).
      corrections: [J] per-frame corrections added as well (same units).
      fixed_deltas: [Cf, 6] se(3) deltas (m, rad) right-applied to fixed cameras' nominal.
      mounted_deltas: [Cw, 6] se(3) deltas right-applied to mounted cameras' nominal.

    """
    q = jnp.asarray(q_measured) + joint_offsets + corrections
    return assemble(km, body_poses(km, q), fixed_deltas, mounted_deltas)


def forward_batch(km: KinematicModel, q_measured, joint_offsets, corrections, fixed_deltas,
                  mounted_deltas) -> RigPoses:
    """`forward` over frames: q_measured [F, J], corrections [F, J]; the rest shared."""
    fn = jax.vmap(forward, in_axes=(None, 0, None, 0, None, None))
    return fn(km, q_measured, joint_offsets, corrections, fixed_deltas, mounted_deltas)


forward_jit = jax.jit(forward)
forward_batch_jit = jax.jit(forward_batch)
# `assemble` over frames: bodies [F, nbody, 4, 4] (e.g. from `reference_body_poses`)
assemble_batch = jax.vmap(assemble, in_axes=(None, 0, None, None))
assemble_batch_jit = jax.jit(assemble_batch)


class BodyLinearization(NamedTuple):
    """Body poses of frames and their derivative by the joints, at one joint vector each."""

    bodies: jax.Array  # [F, nbody, 4, 4] T_world_body at q
    jac: jax.Array     # [F, nbody, 4, 4, J] d bodies / d q (rig joint order)


@jax.jit
def linearize_bodies(km: KinematicModel, q) -> BodyLinearization:
    """Body poses at joints q [F, J] and their Jacobians by the rig joints.

    With `linearized_bodies` a function that needs the body poses and their gradient
    by the joints at q only (an optimiser step) holds no kinematics of its own: XLA
    compiles MJX's kinematics and its derivative here, once, instead of inside every
    step function (docs/calibration.md "Session 43").

    The Jacobian is MJX's own (`mjx.com_pos`, then `mjx.jac` at every body's origin):
    d p_b / d q = jacp, d R_b / d q = [jacr]x R_b, mapped from the dofs to the rig
    joints by `km.dof_map`. Equal to `jax.jacfwd` of `body_poses` to float32 rounding
    (tests/test_kinematics.py), and about half its tracing and compile time.
    """
    mjx = _mjx()
    m = km.mjx_model

    def one(qf):
        qpos = km.qpos_base + km.joint_map @ qf
        d = mjx.make_data(m).replace(qpos=qpos.astype(km.qpos_base.dtype))
        d = mjx.com_pos(m, mjx.kinematics(m, d))
        rot = d.xmat.reshape(-1, 3, 3)
        jacp, jacr = jax.vmap(lambda p, b: mjx.jac(m, d, p, b))(
            d.xpos, jnp.arange(m.nbody))                               # [nbody, nv, 3]
        jacp = jnp.einsum("bvi,vk->bik", jacp, km.dof_map)             # [nbody, 3, J]
        w = jnp.einsum("bvi,vk->bik", jacr, km.dof_map)
        zero = jnp.zeros_like(w[:, 0])
        skew = jnp.stack([jnp.stack([zero, -w[:, 2], w[:, 1]], 1),
                          jnp.stack([w[:, 2], zero, -w[:, 0]], 1),
                          jnp.stack([-w[:, 1], w[:, 0], zero], 1)], 1)  # [nbody, 3, 3, J]
        d_rot = jnp.einsum("bijk,bjl->bilk", skew, rot)
        top = jnp.concatenate([d_rot, jacp[:, :, None, :]], axis=2)    # [nbody, 3, 4, J]
        jac = jnp.concatenate([top, jnp.zeros_like(top[:, :1])], axis=1)
        return make_pose(rot, d.xpos), jac

    return BodyLinearization(*jax.vmap(one)(q))


def linearized_bodies(lin: BodyLinearization, dq) -> jax.Array:
    """Body poses [F, nbody, 4, 4] at q + dq to first order, exact at dq = 0.

    Pass dq = x - stop_gradient(x) (zero, with x's gradient): the values are `lin.bodies`
    bit for bit and the gradient by x is that of the kinematics at q.
    """
    return lin.bodies + jnp.einsum("fnijk,fk->fnij", lin.jac, dq)


def zero_params(km: KinematicModel) -> dict:
    """Zero offsets and deltas: joint_offsets [J], fixed_deltas [Cf,6], mounted_deltas [Cw,6]."""
    return {
        "joint_offsets": jnp.zeros(len(km.joint_names), jnp.float32),
        "fixed_deltas": jnp.zeros((km.fixed_nominal.shape[0], 6), jnp.float32),
        "mounted_deltas": jnp.zeros((km.mounted_nominal.shape[0], 6), jnp.float32),
    }


# ----------------------------------------------------------------------- C MuJoCo reference


def body_poses_reference(model: mujoco.MjModel, qpos: np.ndarray) -> np.ndarray:
    """C MuJoCo `mj_kinematics`: qpos [nq] -> body poses [nbody, 4, 4] float64."""
    d = mujoco.MjData(model)
    d.qpos[:] = qpos
    mujoco.mj_kinematics(model, d)
    T = np.tile(np.eye(4), (model.nbody, 1, 1))
    T[:, :3, :3] = d.xmat.reshape(-1, 3, 3)
    T[:, :3, 3] = d.xpos
    return T


def reference_body_poses(model: mujoco.MjModel, layout: JointLayout,
                         q: np.ndarray) -> np.ndarray:
    """Body poses [F, nbody, 4, 4] (float64) of frames of total joint values q [F, J].

    C MuJoCo's `mj_kinematics`, frame by frame (about 10 us each): what the session uses
    where it needs the poses' values only (painting, scoring, sizing the pair list), so
    those functions hold no MJX kinematics to trace and compile. Agrees with `body_poses`
    to float32 rounding (tests/test_kinematics.py).
    """
    q = np.asarray(q, np.float64).reshape(-1, layout.A.shape[1])
    out = np.tile(np.eye(4), (len(q), model.nbody, 1, 1))
    for f, qf in enumerate(q):
        out[f] = body_poses_reference(model, layout.qpos(qf))
    return out


def reference_forward(rig: Rig, model: mujoco.MjModel, q: np.ndarray,
                      camera_poses: dict[str, np.ndarray] | None = None) -> RigPoses:
    """Float64 numpy twin of `forward` with q = total joint values [J] (offsets included).

    `camera_poses` optionally replaces cameras' nominal poses ({name: [4, 4]} in the mount).
    Returns numpy arrays in a `RigPoses`.
    """
    lay = joint_layout(rig, model)
    bodies = body_poses_reference(model, lay.qpos(np.asarray(q, np.float64)))
    cams = []
    for c in rig.cameras:
        nominal = (camera_poses or {}).get(c.name, c.nominal)
        mount = np.eye(4) if c.mount == rig.world_frame else bodies[_body_id(model, c.mount)]
        cams.append(mount @ nominal)
    tcp = []
    for a in rig.arms:
        tb = bodies[_body_id(model, a.tcp_body)]
        tcp.append(tb[:3, 3] + tb[:3, :3] @ np.asarray(a.tcp_offset))
    return RigPoses(bodies, np.stack(cams), np.stack(tcp))


def tcp_positions(rig: Rig, model: mujoco.MjModel, q: np.ndarray) -> np.ndarray:
    """Tool centre points for frames of joint values q [F, J] -> [F, A, 3] (m, float64)."""
    lay = joint_layout(rig, model)
    d = mujoco.MjData(model)
    ids = [_body_id(model, a.tcp_body) for a in rig.arms]
    offs = np.asarray([a.tcp_offset for a in rig.arms], np.float64)
    out = np.zeros((len(q), len(ids), 3))
    for f, qf in enumerate(np.asarray(q, np.float64)):
        d.qpos[:] = lay.qpos(qf)
        mujoco.mj_kinematics(model, d)
        for a, b in enumerate(ids):
            out[f, a] = d.xpos[b] + d.xmat[b].reshape(3, 3) @ offs[a]
    return out
