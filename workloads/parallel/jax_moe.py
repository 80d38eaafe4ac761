"""Sparse expert feed-forward layers in flax (ST-MoE; the router's rules: workloads/common/moe.py,
TensorFlow's side: tf_moe.py).

Expert parallelism is GShard's, written as global einsums whose operands carry logical axis
names (jax_runtime.constrain): the tokens [groups, group, embed] are split over 'batch'
(the data and expert mesh axes jointly, harness.mesh's rule table), the experts' inputs
[experts, groups, capacity, embed] over 'experts' (the expert axis) and what is left of
'batch' (data). Between the two layouts GSPMD moves each device's slots for the experts it does
not hold to the device that does: an all-to-all over `expert`, and one back for the combine
(the compiled step's HLO shows them; tests/parallel/test_jax_moe.py reads it). The expert
kernels' hidden dimension is 'mlp', split on a model axis when there is one: expert and model
axes compose. Every layout computes the same numbers: routing is per group, and a group never
straddles devices (moe.check_groups).
"""
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from workloads.common import moe as moe_lib
from workloads.parallel.jax_runtime import constrain

ROUTER_INIT = nn.initializers.variance_scaling(0.1, "fan_in", "truncated_normal")  # ST-MoE s=0.1
EXPERT_INIT = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=-2,
                                               out_axis=-1, batch_axis=(0,))   # Glorot per expert


def route(logits, real, *, capacity, second_policy="all", threshold=0.2, noise=None):
  """Top-2 routing of groups (workloads/common/moe.py): logits [G, S, E] (float32 or wider),
  real [G, S] (False at padding), noise [G, S] uniform in [0, 1) for the random policy.
  -> (dispatch [G, S, E, C] 0/1, combine [G, S, E, C] gates, stats) where stats holds the
  group-mean load-balance loss (no coefficient), the z-loss over real tokens, the real and
  dropped (routed to no expert) token counts and the top-1 count per expert (before drops)."""
  num_experts = logits.shape[-1]
  realf = real.astype(logits.dtype)
  probs = jax.nn.softmax(logits, axis=-1)
  index_1 = jnp.argmax(probs, axis=-1)
  first = jax.nn.one_hot(index_1, num_experts, dtype=logits.dtype)
  gate_1 = jnp.sum(probs * first, axis=-1)
  rest = probs * (1.0 - first)
  second = jax.nn.one_hot(jnp.argmax(rest, axis=-1), num_experts, dtype=logits.dtype)
  gate_2 = jnp.sum(rest * second, axis=-1)
  denom = gate_1 + gate_2 + 1e-9
  gate_1, gate_2 = gate_1 / denom, gate_2 / denom
  mask_1 = first * realf[..., None]
  mask_2 = second * realf[..., None]
  # f_e and P_e over the group's positions (padding zero), E * sum_e f_e P_e, mean over groups
  density = jnp.mean(mask_1, axis=1)
  proxy = jnp.mean(probs * realf[..., None], axis=1)
  balance = jnp.mean(jnp.sum(density * proxy, axis=-1)) * num_experts
  log_z = jax.nn.logsumexp(logits, axis=-1)
  count = jnp.sum(realf)
  z_loss = jnp.sum(jnp.square(log_z) * realf) / jnp.maximum(count, 1.0)
  load = jnp.sum(mask_1, axis=(0, 1))
  if second_policy == "random":
    mask_2 = mask_2 * (noise < gate_2 / threshold).astype(logits.dtype)[..., None]
  position_1 = (jnp.cumsum(mask_1, axis=1) - mask_1) * mask_1        # exclusive, token order
  mask_1 = mask_1 * (position_1 < capacity)
  position_2 = (jnp.cumsum(mask_2, axis=1) - mask_2
                + jnp.sum(mask_1, axis=1, keepdims=True)) * mask_2    # after every top-1
  mask_2 = mask_2 * (position_2 < capacity)
  kept_1, kept_2 = jnp.sum(mask_1, axis=-1), jnp.sum(mask_2, axis=-1)
  slot_1 = jax.nn.one_hot(jnp.sum(position_1 * mask_1, axis=-1).astype(jnp.int32), capacity,
                          dtype=logits.dtype)
  slot_2 = jax.nn.one_hot(jnp.sum(position_2 * mask_2, axis=-1).astype(jnp.int32), capacity,
                          dtype=logits.dtype)
  routed_1 = mask_1[..., None] * slot_1[:, :, None, :]
  routed_2 = mask_2[..., None] * slot_2[:, :, None, :]
  combine = ((gate_1 * kept_1)[..., None, None] * routed_1
             + (gate_2 * kept_2)[..., None, None] * routed_2)
  dispatch = routed_1 + routed_2
  dropped = jnp.sum(realf * (kept_1 + kept_2 == 0))
  stats = {"balance_loss": balance, "z_loss": z_loss, "tokens": count, "dropped": dropped,
           "load": load}
  return dispatch, combine, stats


class ExpertDense(nn.Module):
  """E dense layers at once: kernel [E, in, out], bias [E, out]."""
  num_experts: int
  features: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", EXPERT_INIT, (self.num_experts, x.shape[-1], self.features))
    bias = self.param("bias", nn.initializers.zeros, (self.num_experts, self.features))
    y = jnp.einsum("egcm,emh->egch", x, kernel.astype(self.dtype))
    return y + bias.astype(self.dtype)[:, None, None, :]


class Experts(nn.Module):
  num_experts: int
  hidden_size: int
  filter_size: int
  dtype: Any = jnp.float32

  def setup(self):
    self.filter = ExpertDense(self.num_experts, self.filter_size, self.dtype)
    self.output = ExpertDense(self.num_experts, self.hidden_size, self.dtype)

  def __call__(self, x):
    hidden = constrain(nn.relu(self.filter(x)), ("experts", "batch", None, "mlp"))
    return constrain(self.output(hidden), ("experts", "batch", None, "embed"))


class MoEFeedForward(nn.Module):
  """A mixture of `moe.num_experts` ReLU feed-forwards (hidden -> filter -> hidden) routed
  top-2; x [B, L, H], real [B, L] -> [B, L, H]. Sows its router statistics (route's stats)
  into the 'moe' collection when that is mutable (the train step's)."""
  hidden_size: int
  filter_size: int
  moe: moe_lib.MoEConfig
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, real, train):
    moe, (rows, length, hidden) = self.moe, x.shape
    groups = moe_lib.group_count(rows * length, moe.group_size)
    size = rows * length // groups
    factor = moe.capacity_factor_train if train else moe.capacity_factor_eval
    policy = moe.second_policy if train else moe.second_policy_eval
    capacity = moe_lib.capacity(size, moe.num_experts, factor, moe.min_expert_capacity)
    acc = jnp.promote_types(self.dtype, jnp.float32)         # the router: float32 at least
    tokens = constrain(x.reshape(groups, size, hidden), ("batch", "length", "embed"))
    logits = nn.Dense(moe.num_experts, use_bias=False, kernel_init=ROUTER_INIT, dtype=acc,
                      name="router")(tokens.astype(acc))
    noise = None
    if policy == "random":
      noise = jax.random.uniform(self.make_rng("dropout"), (groups, size), acc)
    dispatch, combine, stats = route(logits, real.reshape(groups, size), capacity=capacity,
                                     second_policy=policy, threshold=moe.second_threshold,
                                     noise=noise)
    stats["aux_loss"] = (moe.load_balance_loss * stats["balance_loss"]
                         + moe.router_z_loss * stats["z_loss"])
    if not self.is_initializing():          # init returns the parameters only
      self.sow("moe", "routing", stats)
    # each device packs its own groups' slots (no communication), then the change of layout
    # from groups over data x expert to experts over expert is the all-to-all; and back
    expert_inputs = constrain(jnp.einsum("gsec,gsm->egcm", dispatch.astype(self.dtype), tokens),
                              ("routes", "batch", None, "embed"))
    expert_inputs = constrain(expert_inputs, ("experts", "batch", None, "embed"))
    outputs = Experts(moe.num_experts, self.hidden_size, self.filter_size, self.dtype,
                      name="experts")(expert_inputs)
    outputs = constrain(outputs, ("routes", "batch", None, "embed"))
    y = jnp.einsum("gsec,egcm->gsm", combine.astype(self.dtype), outputs)
    return constrain(y.reshape(rows, length, hidden), ("batch", "length", "embed"))


def aux_loss(sown):
  """The MoE layers' training loss terms: the sum over layers of alpha * balance + c_z * z."""
  layers = jax.tree.leaves(sown, is_leaf=lambda s: isinstance(s, dict) and "z_loss" in s)
  return sum(s["aux_loss"] for s in layers)


def router_metrics(sown):
  """{z_loss, balance_loss (means over layers), dropped, tokens, load [E] (sums)}: what the
  trainer reports per block (moe.report)."""
  layers = jax.tree.leaves(sown, is_leaf=lambda s: isinstance(s, dict) and "z_loss" in s)
  mean = lambda key: sum(s[key] for s in layers) / len(layers)
  total = lambda key: sum(s[key] for s in layers)
  return {"z_loss": mean("z_loss"), "balance_loss": mean("balance_loss"),
          "dropped": total("dropped"), "tokens": total("tokens"), "load": total("load")}
