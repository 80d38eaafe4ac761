"""The ST-MoE router (jax_moe.route and tf_moe.route, the rules of workloads/common/moe.py)
against analytic values and hand-made routings: the z-loss of zero logits is (ln E)^2; a
perfectly balanced top-1 assignment has balance loss 1 (alpha times it: alpha); Mesh-TF's
capacity; top-1 assignments take slots before top-2 ones, left to right within a group, and
padding takes none; gates renormalized to sum to 1; the random second policy routes with
probability min(1, gate_2 / 0.2)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from workloads.common import moe
from workloads.parallel import jax_moe, tf_moe

pytestmark = pytest.mark.usefixtures("jax_float64")     # tests/conftest.py


def jax_route(logits, real, capacity, policy="all", noise=None):
  dispatch, combine, stats = jax_moe.route(
      jnp.asarray(logits), jnp.asarray(real), capacity=capacity, second_policy=policy,
      noise=None if noise is None else jnp.asarray(noise))
  stats = {k: np.asarray(v) for k, v in stats.items()}
  return np.asarray(dispatch), np.asarray(combine), stats


def tf_route(logits, real, capacity, policy="all", noise=None):
  """tf_moe.route's sums turned into jax_moe.route's means (group-mean balance, z over real
  tokens), so one set of expectations checks both."""
  dispatch, combine, stats = tf_moe.route(
      tf.constant(logits), tf.constant(real), capacity=capacity, second_policy=policy,
      noise=None if noise is None else tf.constant(noise))
  stats = {k: v.numpy() for k, v in stats.items()}
  stats["balance_loss"] = stats["balance_loss"] / logits.shape[0]
  stats["z_loss"] = stats["z_loss"] / max(stats["tokens"], 1.0)
  return dispatch.numpy(), combine.numpy(), stats


ROUTERS = {"jax": jax_route, "tf": tf_route}
routers = pytest.mark.parametrize("framework", ROUTERS)


@routers
@pytest.mark.parametrize("experts", [2, 4, 16])
def test_zero_logits_give_z_loss_ln_e_squared(framework, experts):
  logits = np.zeros((3, 8, experts))
  _, _, stats = ROUTERS[framework](logits, np.ones((3, 8), bool), capacity=8)
  np.testing.assert_allclose(stats["z_loss"], math.log(experts) ** 2, rtol=1e-12)


@routers
def test_perfectly_balanced_top1_gives_balance_loss_one_so_alpha_times_it_is_alpha(framework):
  """Token i's top-1 is expert i mod E, with the same logit pattern for every expert: f_e and
  P_e are 1/E, so E * sum_e f_e P_e = 1 (top-1 only: counting both choices would give 2)."""
  experts, size = 4, 8
  logits = np.zeros((2, size, experts))
  logits[:, np.arange(size), np.arange(size) % experts] = 3.0
  _, _, stats = ROUTERS[framework](logits, np.ones((2, size), bool), capacity=size)
  np.testing.assert_allclose(stats["balance_loss"], 1.0, rtol=1e-12)
  alpha = moe.MoEConfig().load_balance_loss
  assert alpha * stats["balance_loss"] == pytest.approx(0.01, rel=1e-12)
  np.testing.assert_array_equal(stats["load"], [4, 4, 4, 4])


def test_capacity_is_mesh_tf_formula():
  assert moe.capacity(1024, 16, 1.25, 4) == 80          # floor(1024 * 1.25 / 16)
  assert moe.capacity(1024, 16, 2.0, 4) == 128
  assert moe.capacity(12, 4, 1.25, 4) == 4              # floor(3.75) = 3, raised to the floor 4
  assert moe.capacity(8, 2, 4.0, 1) == 8                # never more than the group
  assert moe.capacity(100, 3, 1.0, 1) == 33
  assert moe.group_count(96 * 4, 96) == 4 and moe.group_count(100, 96) == 1


def hand_made():
  """One group, 2 experts, 6 tokens; token 2 is padding. Top-1 (logit 2 against 1):
  expert 0 for tokens 0, 1, 2, 5 and expert 1 for tokens 3, 4; the second is the other."""
  top1 = np.array([0, 0, 0, 1, 1, 0])
  logits = np.ones((1, 6, 2))
  logits[0, np.arange(6), top1] = 2.0
  real = np.array([[True, True, False, True, True, True]])
  return logits, real


def slots(dispatch):
  """{(token, expert, slot)} of a one-group dispatch."""
  return {tuple(int(i) for i in ix) for ix in np.argwhere(dispatch[0] > 0)}


@routers
def test_top1_claims_capacity_before_top2_left_to_right_and_padding_takes_none(framework):
  logits, real = hand_made()
  dispatch, combine, stats = ROUTERS[framework](logits, real, capacity=3)
  # expert 0: tokens 0, 1, 5 (top-1) fill slots 0-2, so tokens 3, 4 (its top-2) find it full;
  # expert 1: tokens 3, 4 (top-1) in slots 0, 1, then token 0's top-2 in slot 2, then full
  assert slots(dispatch) == {(0, 0, 0), (1, 0, 1), (5, 0, 2), (3, 1, 0), (4, 1, 1), (0, 1, 2)}
  gates = combine[0].sum(axis=(1, 2))
  p1, p2 = math.exp(2) / (math.exp(2) + math.e), math.e / (math.exp(2) + math.e)
  # p1 + p2 = 1 (to the 1e-9 Mesh-TF adds to the denominator)
  np.testing.assert_allclose(gates, [1.0, p1, 0.0, p1, p1, p1], rtol=0, atol=1e-8)
  assert p1 + p2 == pytest.approx(1.0)
  assert stats["tokens"] == 5 and stats["dropped"] == 0
  np.testing.assert_array_equal(stats["load"], [3, 2])          # top-1, padding left out


@routers
def test_a_token_whose_assignments_all_overflow_is_dropped(framework):
  logits, real = hand_made()
  dispatch, combine, stats = ROUTERS[framework](logits, real, capacity=2)
  # token 5's top-1 (expert 0, third) and top-2 (expert 1, after its two top-1s) overflow
  assert slots(dispatch) == {(0, 0, 0), (1, 0, 1), (3, 1, 0), (4, 1, 1)}
  assert combine[0, 5].sum() == 0 and stats["dropped"] == 1


@routers
def test_renormalized_gates_sum_to_one(framework):
  logits = np.random.default_rng(0).normal(size=(4, 16, 8)) * 2
  _, combine, _ = ROUTERS[framework](logits, np.ones((4, 16), bool), capacity=32)
  np.testing.assert_allclose(combine.sum(axis=(2, 3)), 1.0, rtol=0, atol=1e-8)


@routers
@pytest.mark.parametrize("gate_2,rate", [(0.05, 0.25), (0.1, 0.5), (0.15, 0.75), (0.3, 1.0)])
def test_random_second_policy_routes_with_probability_min_1_gate2_over_threshold(
    framework, gate_2, rate):
  """Logits with renormalized gates (1 - g, g) over 400 groups of 100 tokens: the second
  expert is used at rate min(1, g / 0.2), within 5 binomial standard deviations (fixed noise:
  no flakes)."""
  groups, size = 400, 100
  logits = np.full((groups, size, 3), -30.0)
  logits[..., 0], logits[..., 1] = math.log(1 - gate_2), math.log(gate_2)
  noise = np.random.default_rng(1).uniform(size=(groups, size))
  dispatch, _, _ = ROUTERS[framework](logits, np.ones((groups, size), bool), capacity=size,
                                      policy="random", noise=noise)
  tokens = groups * size
  used = dispatch[:, :, 1].sum() / tokens
  assert abs(used - rate) <= 5 * math.sqrt(rate * (1 - rate) / tokens) + 1e-9
  assert dispatch[:, :, 0].sum() == tokens                  # the top-1 always


def test_jax_and_tf_routers_agree_on_random_logits():
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(3, 24, 4))
  real = rng.uniform(size=(3, 24)) > 0.2
  noise = rng.uniform(size=(3, 24))
  for policy in ("all", "random"):
    a, b = jax_route(logits, real, 7, policy, noise), tf_route(logits, real, 7, policy, noise)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_allclose(a[1], b[1], rtol=1e-12)
    for key in a[2]:
      np.testing.assert_allclose(a[2][key], b[2][key], rtol=1e-12, err_msg=key)


def test_router_logits_stay_float32_under_bfloat16_compute():
  layer = jax_moe.MoEFeedForward(8, 16, moe.MoEConfig(num_experts=4, group_size=4),
                                 dtype=jnp.bfloat16)
  x, real = jnp.ones((2, 4, 8), jnp.bfloat16), jnp.ones((2, 4), bool)
  params = layer.init(jax.random.key(0), x, real, False)
  jaxpr = str(jax.make_jaxpr(lambda p: layer.apply(p, x, real, False))(params))
  router = next(line for line in jaxpr.splitlines() if "dot_general" in line)
  assert "f32[2,4,4]" in router.replace(" ", "")      # the first product: the router's logits


def test_the_progress_line_reports_the_router_figures_of_a_block():
  """A block's router figures as the driver prints them (and TensorBoard's scalars): the
  losses, the dropped share of the tokens and each expert's share of the top-1 load."""
  line, scalars = moe.report({"z_loss": 1.5, "balance_loss": 1.25, "dropped": 3,
                              "tokens": 200, "load": [10, 30, 40, 20]})
  assert line == "router z 1.5 balance 1.25 dropped 1.50% load 0.10/0.30/0.40/0.20"
  assert scalars["router/dropped_fraction"] == 0.015
  assert [scalars[f"router/load_expert_{e}"] for e in range(4)] == [0.1, 0.3, 0.4, 0.2]
