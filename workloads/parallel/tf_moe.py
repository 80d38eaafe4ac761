"""Sparse expert feed-forward layers in Keras (ST-MoE; the router's rules:
workloads/common/moe.py; jax_moe.py is JAX's side, with the same parameter paths and numbers).

Expert parallelism on tf.distribute (tf_runtime.StrategyRuntime with an expert axis): the batch
is split over data x expert replicas, and each replica holds E / expert of the experts (their
kernels are tf_model_parallel.ShardedWeights on the `expert` axis). A replica routes its own
tokens, sends each expert's slots to the replica holding it and gets the outputs back: two
all-to-alls over its expert peers (tf_runtime.all_to_all: tf.distribute has none, so it is an
all-gather, built on the all-reduce, and a slice; gradients are the all-reduce's). An expert
shard's gradient is summed over the replicas holding the same experts (tf_runtime.data_sum),
divided by their model copies. Beside a model axis the experts stay whole over it: each model
peer routes the same tokens, and the all-to-alls run among the replicas of one model index.
The beam-search eval gathers the experts' weights once per batch (gathered_weights) and routes
every replica's tokens to whole experts locally: no collective inside the decode loop.

The router's losses are this replica's share of the global ones (the sum over replicas is the
loss of the whole batch): the z-loss over the global count of real tokens, the balance loss
over the global number of groups. A layer adds its figures to the `collect()` list the trainer
opens around the training forward pass.
"""
import contextlib
import math
import threading

import keras
import tensorflow as tf

from workloads.common import moe as moe_lib
from workloads.parallel import tf_layers
from workloads.parallel import tf_model_parallel as mp

_COLLECTED = threading.local()      # per replica thread


@contextlib.contextmanager
def collect():
  """While a training forward pass runs: yields the list the MoE layers append their router
  figures to (dicts of tensors, route's stats plus 'aux_loss')."""
  saved = getattr(_COLLECTED, "value", None)
  _COLLECTED.value = []
  try:
    yield _COLLECTED.value
  finally:
    _COLLECTED.value = saved


def route(logits, real, *, capacity, second_policy="all", threshold=0.2, noise=None):
  """jax_moe.route in TensorFlow: logits [G, S, E], real [G, S] bool, noise [G, S] ->
  (dispatch, combine [G, S, E, C], stats of this call's groups: balance_loss summed over them
  (not averaged), z_loss summed over real tokens (not averaged), tokens, dropped, load)."""
  num_experts = logits.shape[-1]
  dtype = logits.dtype
  realf = tf.cast(real, dtype)
  limit = tf.cast(capacity, dtype)          # a tensor while decoding (tf_moe: one group)
  probs = tf.nn.softmax(logits, axis=-1)
  first = tf.one_hot(tf.argmax(probs, axis=-1), num_experts, dtype=dtype)
  gate_1 = tf.reduce_sum(probs * first, axis=-1)
  rest = probs * (1.0 - first)
  second = tf.one_hot(tf.argmax(rest, axis=-1), num_experts, dtype=dtype)
  gate_2 = tf.reduce_sum(rest * second, axis=-1)
  denom = gate_1 + gate_2 + 1e-9
  gate_1, gate_2 = gate_1 / denom, gate_2 / denom
  mask_1 = first * realf[..., None]
  mask_2 = second * realf[..., None]
  density = tf.reduce_mean(mask_1, axis=1)
  proxy = tf.reduce_mean(probs * realf[..., None], axis=1)
  balance = tf.reduce_sum(density * proxy) * num_experts
  log_z = tf.reduce_logsumexp(logits, axis=-1)
  z_loss = tf.reduce_sum(tf.square(log_z) * realf)
  load = tf.reduce_sum(mask_1, axis=(0, 1))
  if second_policy == "random":
    mask_2 *= tf.cast(noise < gate_2 / threshold, dtype)[..., None]
  position_1 = (tf.cumsum(mask_1, axis=1, exclusive=True)) * mask_1
  mask_1 *= tf.cast(position_1 < limit, dtype)
  position_2 = (tf.cumsum(mask_2, axis=1, exclusive=True)
                + tf.reduce_sum(mask_1, axis=1, keepdims=True)) * mask_2
  mask_2 *= tf.cast(position_2 < limit, dtype)
  kept_1, kept_2 = tf.reduce_sum(mask_1, axis=-1), tf.reduce_sum(mask_2, axis=-1)
  slot_1 = tf.one_hot(tf.cast(tf.reduce_sum(position_1 * mask_1, -1), tf.int32), capacity,
                      dtype=dtype)
  slot_2 = tf.one_hot(tf.cast(tf.reduce_sum(position_2 * mask_2, -1), tf.int32), capacity,
                      dtype=dtype)
  routed_1 = mask_1[..., None] * slot_1[:, :, None, :]
  routed_2 = mask_2[..., None] * slot_2[:, :, None, :]
  combine = ((gate_1 * kept_1)[..., None, None] * routed_1
             + (gate_2 * kept_2)[..., None, None] * routed_2)
  dropped = tf.reduce_sum(realf * tf.cast(kept_1 + kept_2 == 0, dtype))
  stats = {"balance_loss": balance, "z_loss": z_loss, "tokens": tf.reduce_sum(realf),
           "dropped": dropped, "load": load}
  return routed_1 + routed_2, combine, stats


class ExpertDense(tf_layers.BuiltInInitLayer):
  """E dense layers at once: kernel [E, in, out] (Glorot per expert), bias [E, out]; split
  over the expert axis when the runtime has one."""

  @mp.in_path
  def __init__(self, num_experts, in_units, units, runtime=None, **kwargs):
    super().__init__(**kwargs)
    limit = math.sqrt(6.0 / (in_units + units))
    self.kernel = mp.sharded_or_whole(self, runtime, "kernel", (num_experts, in_units, units),
                                      keras.initializers.RandomUniform(-limit, limit), "expert")
    self.bias = mp.sharded_or_whole(self, runtime, "bias", (num_experts, units),
                                    keras.initializers.Zeros(), "expert")

  def call(self, x):
    y = tf.einsum("egcm,emh->egch", x, mp.read(self.kernel, x.dtype))
    return y + mp.read(self.bias, x.dtype)[:, None, None, :]


class Router(tf_layers.BuiltInInitLayer):
  """The router's kernel [hidden, E], computed in `dtype` (float32, or float64 in float64)."""

  def __init__(self, hidden, num_experts, **kwargs):
    super().__init__(**kwargs)
    self.kernel = self.add_weight(
        shape=(hidden, num_experts), name="kernel",
        initializer=keras.initializers.VarianceScaling(0.1, "fan_in", "truncated_normal"))

  def call(self, x):
    return tf.einsum("gsm,me->gse", tf.cast(x, self.compute_dtype),
                     tf.cast(self.kernel, self.compute_dtype))


class Experts(tf_layers.BuiltInInitLayer):
  @mp.in_path
  def __init__(self, num_experts, hidden, filter_size, runtime=None, **kwargs):
    super().__init__(**kwargs)
    self.filter = ExpertDense(num_experts, hidden, filter_size, runtime, name="filter",
                              dtype=self.dtype_policy)
    self.output_dense = ExpertDense(num_experts, filter_size, hidden, runtime, name="output",
                                    dtype=self.dtype_policy)

  def sublayers(self):
    return {"filter": self.filter, "output": self.output_dense}

  def call(self, x):
    return self.output_dense(tf.nn.relu(self.filter(x)))


class MoEFeedForward(tf_layers.BuiltInInitLayer):
  """jax_moe.MoEFeedForward in Keras: call(x [B, L, H], real [B, L], training) -> [B, L, H]."""

  @mp.in_path
  def __init__(self, hidden, filter_size, moe, accumulation_dtype, runtime=None, **kwargs):
    super().__init__(**kwargs)
    self.moe, self.runtime = moe, runtime
    self.router = Router(hidden, moe.num_experts, name="router", dtype=accumulation_dtype)
    self.experts = Experts(moe.num_experts, hidden, filter_size, runtime, name="experts",
                           dtype=self.dtype_policy)
    self.noise = tf_layers.ExampleNoise()

  def sublayers(self):
    return {"router": self.router, "experts": self.experts}

  def _experts(self, inputs):
    """inputs [E, groups, C, H] of this replica's groups -> the experts' outputs for them;
    across the expert axis through the holders of each expert."""
    if not mp.is_sharded(self.experts.filter.kernel):
      return self.experts(inputs)
    rt, shape = self.runtime, inputs.shape
    peers, groups = rt.expert, shape[1]
    mine = rt.all_to_all(tf.reshape(inputs, [peers, shape[0] // peers] + shape[1:]), "expert")
    mine = tf.reshape(tf.transpose(mine, [1, 0, 2, 3, 4]),
                      [shape[0] // peers, peers * groups] + shape[2:])
    out = self.experts(mine)
    back = tf.transpose(tf.reshape(out, [shape[0] // peers, peers, groups] + shape[2:]),
                        [1, 0, 2, 3, 4])
    return tf.reshape(rt.all_to_all(back, "expert"), shape)

  def call(self, x, real, training=False):
    if mp.is_sharded(self.experts.filter.kernel) and tf.distribute.in_cross_replica_context():
      # tf_model.build's call outside the replicas only makes the other layers' weights: an
      # expert shard is one replica's, and its all-to-all runs in replica context only
      return tf.zeros_like(x)
    moe = self.moe
    rows, length, hidden = x.shape
    factor = moe.capacity_factor_train if training else moe.capacity_factor_eval
    policy = moe.second_policy if training else moe.second_policy_eval
    if rows is None:          # beam-search decoding (rows unknown when traced): one group
      rows = tf.shape(x)[0]
      groups, size = 1, rows * length
      per_expert = tf.cast(tf.cast(size, tf.float64) * factor / moe.num_experts, tf.int32)
      capacity = tf.maximum(tf.minimum(size, per_expert), moe.min_expert_capacity)
    else:
      groups = moe_lib.group_count(rows * length, moe.group_size)
      size = rows * length // groups
      capacity = moe_lib.capacity(size, moe.num_experts, factor, moe.min_expert_capacity)
    tokens = tf.reshape(x, [groups, size, hidden])
    logits = self.router(tokens)
    noise = None
    if policy == "random":
      noise = tf.reshape(self.noise(tf.shape(real), [self.noise.key, 0]), [groups, size])
      noise = tf.cast(noise, logits.dtype)
    dispatch, combine, stats = route(logits, tf.reshape(real, [groups, size]), capacity=capacity,
                                     second_policy=policy, threshold=moe.second_threshold,
                                     noise=noise)
    collected = getattr(_COLLECTED, "value", None)
    if training and collected is not None:
      collected.append(self._shares(stats, groups))
    inputs = tf.einsum("gsec,gsm->egcm", tf.cast(dispatch, x.dtype), tokens)
    y = tf.einsum("gsec,egcm->gsm", tf.cast(combine, x.dtype), self._experts(inputs))
    return tf.reshape(y, [rows, length, hidden])

  def _shares(self, stats, groups):
    """This replica's shares of the global router losses, and its counts."""
    rt = self.runtime
    shards = rt.data if rt is not None else 1
    # every model peer routes the same tokens: the sum over replicas counts each `copies` times
    count = rt.all_sum(stats["tokens"]) / rt.copies if rt is not None else stats["tokens"]
    z_loss = stats["z_loss"] / tf.maximum(count, 1.0)
    balance = stats["balance_loss"] / (groups * shards)
    return {**stats, "z_loss": z_loss, "balance_loss": balance,
            "aux_loss": self.moe.load_balance_loss * balance + self.moe.router_z_loss * z_loss}


def replica_figures(collected, copies=1):
  """The MoE layers' figures of one forward pass -> this replica's step figures: z and
  balance losses averaged over the layers (shares: summed over replicas they are the global
  ones), counts summed; each divided by `copies` (the runtime's: model peers route the same
  tokens, so the sum over replicas counts them that many times)."""
  total = {key: tf.add_n([c[key] for c in collected]) / copies for key in
           ("z_loss", "balance_loss", "tokens", "dropped", "load")}
  total["z_loss"] /= len(collected)
  total["balance_loss"] /= len(collected)
  return total


def zero_figures(num_experts):
  """replica_figures' structure in zeros (float64), the train loop's first total."""
  scalar = tf.constant(0.0, tf.float64)
  return {"z_loss": scalar, "balance_loss": scalar, "tokens": scalar, "dropped": scalar,
          "load": tf.zeros([num_experts], tf.float64)}
