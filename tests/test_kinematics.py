"""MJX rig kinematics vs C MuJoCo, gradients, no recompilation, and a foreign MJCF."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from scipy.linalg import expm
from test_rig import gym_aloha_rig_fixture  # noqa: F401 (provides fixture gym_aloha_rig)

from realsim_core.kinematics import (
    assemble_batch_jit,
    build_kinematic_model,
    forward,
    forward_batch_jit,
    joint_layout,
    linearize_bodies,
    linearized_bodies,
    reference_body_poses,
    reference_forward,
    tcp_positions,
)
from realsim_core.rig import MJCF_TO_OPTICAL, load_mjmodel, load_rig

# float32 MJX vs float64 C MuJoCo over a ~1 m chain: a few ulp per joint, ~1e-6 in practice.
POSE_TOL = 1e-5  # m and (rotation-matrix entries ~ rad)


def _twist(xi):
    """Float64 reference se3 exp via the matrix exponential."""
    rho, phi = xi[:3], xi[3:]
    X = np.zeros((4, 4))
    X[:3, :3] = [[0, -phi[2], phi[1]], [phi[2], 0, -phi[0]], [-phi[1], phi[0], 0]]
    X[:3, 3] = rho
    return expm(X)


@pytest.fixture(scope="module")
def builtin():
    rig = load_rig()
    model = load_mjmodel(rig)
    return rig, model, build_kinematic_model(rig, model)


def _random_inputs(km, rng, frames):
    J = len(km.joint_names)
    q = rng.uniform(-0.8, 0.8, (frames, J))
    q[:, 6::7] = rng.uniform(0.015, 0.04, (frames, 2))  # grippers (m)
    return dict(
        q=q,
        off=rng.normal(0, 0.02, J),
        corr=rng.normal(0, 0.005, (frames, J)),
        fd=rng.normal(0, 0.02, (km.fixed_nominal.shape[0], 6)),
        md=rng.normal(0, 0.02, (km.mounted_nominal.shape[0], 6)),
    )


def _check_against_c(rig, model, km, x):
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    out = forward_batch_jit(km, f32(x["q"]), f32(x["off"]), f32(x["corr"]), f32(x["fd"]),
                            f32(x["md"]))
    fixed = [c.name for c in rig.fixed_cameras]
    mounted = [c.name for c in rig.mounted_cameras]
    for f in range(len(x["q"])):
        poses = {c.name: c.nominal @ _twist(x["fd"][fixed.index(c.name)] if c.name in fixed
                                            else x["md"][mounted.index(c.name)])
                 for c in rig.cameras}
        q32 = np.asarray(f32(x["q"][f]) + f32(x["off"]) + f32(x["corr"][f]), np.float64)
        ref = reference_forward(rig, model, q32, camera_poses=poses)
        np.testing.assert_allclose(out.bodies[f], ref.bodies, atol=POSE_TOL)
        np.testing.assert_allclose(out.cameras[f], ref.cameras, atol=POSE_TOL)
        np.testing.assert_allclose(out.tcp[f], ref.tcp, atol=POSE_TOL)
    return out


def test_matches_c_mujoco_and_no_recompile(builtin):
    rig, model, km = builtin
    rng = np.random.default_rng(0)
    _check_against_c(rig, model, km, _random_inputs(km, rng, 3))
    n = forward_batch_jit._cache_size()
    out = _check_against_c(rig, model, km, _random_inputs(km, rng, 3))  # new values, same shapes
    assert forward_batch_jit._cache_size() == n
    assert all(np.isfinite(np.asarray(a)).all() for a in out)


def test_optical_frame_matches_mjcf_camera(builtin):
    """With zero deltas, optical frames are MuJoCo's own cameras @ diag(1, -1, -1)."""
    import mujoco

    rig, model, km = builtin
    d = mujoco.MjData(model)
    d.qpos[:] = np.linspace(-0.5, 0.5, model.nq)
    d.qpos[6:8], d.qpos[14:16] = [0.03, -0.03], [0.02, -0.02]
    mujoco.mj_forward(model, d)
    q = np.concatenate([d.qpos[0:7], d.qpos[8:15]])  # gripper = left finger
    ref = reference_forward(rig, model, q)
    for i, c in enumerate(rig.cameras):
        cid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, c.name)
        T = np.eye(4)
        T[:3, :3], T[:3, 3] = d.cam_xmat[cid].reshape(3, 3), d.cam_xpos[cid]
        np.testing.assert_allclose(ref.cameras[i], T @ MJCF_TO_OPTICAL, atol=1e-9)
    # TCP helper agrees with the reference
    np.testing.assert_allclose(tcp_positions(rig, model, q[None])[0], ref.tcp, atol=1e-12)


def test_gradients_match_finite_differences(builtin):
    _, _, km = builtin
    rng = np.random.default_rng(1)
    x = _random_inputs(km, rng, 1)
    q = jnp.asarray(x["q"][0], jnp.float32)
    w = jnp.asarray(rng.normal(size=(4, 3, 4)), jnp.float32)

    def loss(off, fd, md):
        out = forward(km, q, off, jnp.zeros_like(off), fd, md)
        return jnp.sum(out.cameras[:, :3, :] * w) + jnp.sum(out.tcp ** 2)

    args = tuple(jnp.asarray(x[k], jnp.float32) for k in ("off", "fd", "md"))
    # float32 central differences: eps 1e-2 keeps truncation+roundoff ~1e-3 relative.
    check_grads(jax.jit(loss), args, order=1, modes=["rev"], eps=1e-2, atol=2e-2, rtol=2e-2)


def test_linearized_bodies_hold_forwards_values_and_the_c_jacobian(builtin):
    """`linearize_bodies` against `forward` and C MuJoCo.

    The poses of `forward`, d poses / d q from C MuJoCo (float64 central differences),
    and through `linearized_bodies` the gradient of `forward`.
    """
    rig, model, km = builtin
    rng = np.random.default_rng(3)
    x = _random_inputs(km, rng, 2)
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    q = f32(x["q"]) + f32(x["off"]) + f32(x["corr"])              # [2, J]
    lin = linearize_bodies(km, q)
    zeros = jnp.zeros_like(f32(x["off"]))
    out = forward_batch_jit(km, q, zeros, jnp.zeros_like(q), f32(x["fd"]), f32(x["md"]))
    np.testing.assert_allclose(lin.bodies, out.bodies, rtol=0, atol=1e-6)
    # the Jacobian: every rig joint, by central differences of the float64 C reference
    h = 1e-6
    for f in range(2):
        qf = np.asarray(q[f], np.float64)
        for j in range(q.shape[1]):
            dq = np.zeros_like(qf)
            dq[j] = h
            fd = (reference_forward(rig, model, qf + dq).bodies
                  - reference_forward(rig, model, qf - dq).bodies) / (2 * h)
            np.testing.assert_allclose(lin.jac[f, ..., j], fd, atol=2e-5,
                                       err_msg=f"frame {f} joint {km.joint_names[j]}")
    assert float(jnp.abs(lin.jac).max()) > 0.1   # the joints do move the bodies
    # through the linearisation (zero step): forward's values and its gradient
    w = f32(rng.normal(size=out.bodies.shape))
    corr = f32(x["corr"])

    def direct(off):
        o = forward_batch_jit(km, f32(x["q"]), off, corr, f32(x["fd"]), f32(x["md"]))
        return jnp.sum(o.bodies * w)

    def via_lin(off):
        dq = off[None, :] + corr
        return jnp.sum(linearized_bodies(lin, dq - jax.lax.stop_gradient(dq)) * w)

    off = f32(x["off"])
    assert float(via_lin(off)) == pytest.approx(float(direct(off)), rel=1e-5)
    np.testing.assert_allclose(jax.grad(via_lin)(off), jax.grad(direct)(off), rtol=1e-4,
                               atol=1e-4 * float(jnp.abs(jax.grad(direct)(off)).max()))


def test_reference_body_poses_and_assemble_match_forward(builtin):
    """C MuJoCo's body poses of many frames, assembled by `assemble_batch`, = `forward`.

    What the session's value-only functions (held-out scores, painting) use instead of
    MJX: bodies, cameras and TCPs agree with `forward_batch` to float32 rounding.
    """
    rig, model, km = builtin
    x = _random_inputs(km, np.random.default_rng(5), 3)
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    q = np.asarray(f32(x["q"]) + f32(x["off"]) + f32(x["corr"]), np.float64)
    bodies = reference_body_poses(model, joint_layout(rig, model), q)
    assert bodies.shape == (3, model.nbody, 4, 4) and bodies.dtype == np.float64
    for f in range(3):       # frame by frame the C reference itself
        np.testing.assert_array_equal(bodies[f], reference_forward(rig, model, q[f]).bodies)
    out = forward_batch_jit(km, f32(x["q"]), f32(x["off"]), f32(x["corr"]), f32(x["fd"]),
                            f32(x["md"]))
    got = assemble_batch_jit(km, f32(bodies), f32(x["fd"]), f32(x["md"]))
    for name in ("bodies", "cameras", "tcp"):
        np.testing.assert_allclose(getattr(got, name), getattr(out, name), rtol=0,
                                   atol=POSE_TOL, err_msg=name)
    assert float(np.abs(bodies[0] - bodies[1]).max()) > 0.05    # the frames differ


def test_foreign_mjcf_gym_aloha(gym_aloha_rig):
    rig = load_rig(gym_aloha_rig)
    model = load_mjmodel(rig)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        km = build_kinematic_model(rig, model)
    # MJX's collision-only mesh notes are filtered (realsim runs no collision detection)
    assert not [w for w in caught if "coplanar face" in str(w.message)]
    rng = np.random.default_rng(2)
    x = _random_inputs(km, rng, 2)
    x["q"][:, 6::7] = rng.uniform(0.022, 0.05, (2, 2))
    _check_against_c(rig, model, km, x)


def test_mjx_import_leaves_stdout_clean():
    """mujoco-mjx prints its missing-Warp notes to stdout; `--json` output must stay JSON."""
    import subprocess
    import sys

    code = ("from realsim_core.kinematics import _mjx\n"
            "m = _mjx()\n"
            "assert hasattr(m, 'put_model') and _mjx() is m\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""
    assert "Failed to import warp" not in res.stderr
