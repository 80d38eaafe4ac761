"""Optimizers for the JAX side, as optax transformations: MLPerf LARS and SGD (ResNet) and
MLPerf LAMB (BERT, see `mlperf_lamb`).

LARS as MLPerf defines it (the reference ResNet's LARS, logged with the `lars_*` keys):

  for a weight w with gradient g (kernels only):
    trust = eta * ||w|| / (||g|| + wd * ||w|| + eps)     (1 where ||w|| or ||g|| is 0)
    v     = momentum * v + lr * trust * (g + wd * w)
  for bias and batch-norm parameters: no weight decay and no trust ratio:
    v     = momentum * v + lr * g
  w = w - v

Why not `optax.lars`: it chains add_decayed_weights -> scale_by_trust_ratio, so its trust ratio
divides by ||g + wd * w|| rather than ||g|| + wd * ||w||, and its `eps` sits in a different place.
The two differ whenever g and w are not parallel, so this file implements the MLPerf formula.
"""
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax


def decay_mask(params) -> Any:
  """True for parameters that get weight decay and a trust ratio: the conv/dense kernels.

  The role comes from flax's leaf names: `kernel` for weights, `bias`/`scale` for biases and
  batch-norm parameters (AlgoPerf's parameter types, read off the flax convention).
  """
  def is_kernel(path, _):
    return getattr(path[-1], "key", None) == "kernel"
  return jax.tree_util.tree_map_with_path(is_kernel, params)


class LarsState(NamedTuple):
  count: jax.Array
  momentum: Any


def mlperf_lars(learning_rate: Callable, weight_decay: float, momentum: float = 0.9,
                eta: float = 0.001, epsilon: float = 0.0, mask=decay_mask
                ) -> optax.GradientTransformation:
  def init(params):
    return LarsState(count=jnp.zeros([], jnp.int32),
                     momentum=jax.tree.map(jnp.zeros_like, params))

  def update(grads, state, params):
    lr = learning_rate(state.count)
    decayed = mask(params) if callable(mask) else mask

    def scaled_grad(g, w, use_lars):
      if not use_lars:
        return lr * g
      w_norm = jnp.linalg.norm(w)
      g_norm = jnp.linalg.norm(g)
      trust = jnp.where((w_norm > 0) & (g_norm > 0),
                        eta * w_norm / (g_norm + weight_decay * w_norm + epsilon), 1.0)
      return lr * trust * (g + weight_decay * w)

    scaled = jax.tree.map(scaled_grad, grads, params, decayed)
    new_momentum = jax.tree.map(lambda v, s: momentum * v + s, state.momentum, scaled)
    updates = jax.tree.map(jnp.negative, new_momentum)
    return updates, LarsState(count=state.count + 1, momentum=new_momentum)

  return optax.GradientTransformation(init, update)


def sgd_momentum(learning_rate: Callable, weight_decay: float, momentum: float = 0.9,
                 mask=decay_mask) -> optax.GradientTransformation:
  """SGD with momentum as the MLPerf reference's tf.compat.v1 MomentumOptimizer does it:
  v = m * v + (g + wd * w); w = w - lr * v, with weight decay on kernels only."""
  return optax.chain(optax.add_decayed_weights(weight_decay, mask=mask),
                     optax.sgd(learning_rate, momentum=momentum))


# ----------------------------------------------------------------------------- LAMB

def lamb_weight_mask(params) -> Any:
  """True for the weights LAMB decays and trust-ratios: dense kernels and embedding tables.
  False for biases and LayerNorm scale/offset, the reference's exclusion list ("LayerNorm",
  "layer_norm", "bias"), read off flax's leaf names (kernel/embedding vs bias/scale)."""
  def is_weight(path, _):
    return getattr(path[-1], "key", None) in ("kernel", "embedding")
  return jax.tree_util.tree_map_with_path(is_weight, params)


class LambState(NamedTuple):
  count: jax.Array        # updates applied so far
  mu: Any                 # Adam first moment
  nu: Any                 # Adam second moment


def clip_by_global_norm(grads, clip_norm):
  """tf.clip_by_global_norm: g * clip_norm / max(||all g||, clip_norm)."""
  norm = optax.global_norm(grads)
  return jax.tree.map(lambda g: g * (clip_norm / jnp.maximum(norm, clip_norm)), grads)


def mlperf_lamb(learning_rate: Callable, weight_decay: float = 0.01, b1: float = 0.9,
                b2: float = 0.999, eps: float = 1e-6, clip_norm: float | None = 1.0,
                mask=lamb_weight_mask) -> optax.GradientTransformation:
  """LAMB as the MLPerf BERT reference (lamb_optimizer_v1.py + optimization.py) computes it:

    g      = clip_by_global_norm(grads, 1.0)                   (before the update, all params)
    m, v   = b1*m + (1-b1)*g,  b2*v + (1-b2)*g^2
    u      = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)   t = updates including this one
    weights (kernels, embeddings):  u += wd * w;  r = ||w|| / ||u||  (1 if either norm is 0)
    biases, LayerNorm:              r = 1        (no decay, no layer adaptation)
    w      = w - lr(t - 1) * r * u

  Why not `optax.lamb`: its `mask` only removes weight decay; the trust ratio still scales
  every parameter, biases and LayerNorm included, whereas the reference excludes them from
  layer adaptation too (exclude_from_layer_adaptation defaults to exclude_from_weight_decay).
  It also leaves gradient clipping out. Moments, bias correction, eps placement and the
  zero-norm rule match. Under weight-update sharding the norms are over the whole (logical)
  array: GSPMD reduces the partial sums across shards.
  """
  def init(params):
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    return LambState(count=jnp.zeros([], jnp.int32), mu=zeros(), nu=zeros())

  def update(grads, state, params):
    if clip_norm:
      grads = clip_by_global_norm(grads, clip_norm)
    count = state.count + 1
    # bias corrections in the moments' precision (float32, or float64 for float64 params)
    t = count.astype(jnp.result_type(jnp.float32, *jax.tree.leaves(state.mu)))
    lr = learning_rate(state.count)
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, grads)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, grads)
    weights = mask(params) if callable(mask) else mask

    def step(m, v, w, is_weight):
      u = (m / (1 - b1**t)) / (jnp.sqrt(v / (1 - b2**t)) + eps)
      if not is_weight:
        return -lr * u
      u = u + weight_decay * w
      w_norm, u_norm = jnp.linalg.norm(w), jnp.linalg.norm(u)
      ratio = jnp.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0)
      return -lr * ratio * u

    updates = jax.tree.map(step, mu, nu, params, weights)
    return updates, LambState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init, update)


def make_lamb(lamb_cfg, schedule, clip=True) -> optax.GradientTransformation:
  """`clip=False`: without the global-norm clip (a caller that clips the whole gradient
  itself, e.g. before a per-stage update: jax_stage_weights.py)."""
  return mlperf_lamb(lambda step: schedule(step, ops=jnp), lamb_cfg.weight_decay_rate,
                     lamb_cfg.beta_1, lamb_cfg.beta_2, lamb_cfg.epsilon,
                     lamb_cfg.clip_norm if clip else None)


def make_optimizer(opt_cfg, schedule, weight_decay=None) -> optax.GradientTransformation:
  """MLPerf LARS or SGD; `weight_decay`: their decay when it is not `opt_cfg.weight_decay`
  (configs.LarsPolyConfig's lars_weight_decay: there weight_decay is the loss's L2 term)."""
  lr = lambda step: schedule(step, ops=jnp)
  decay = opt_cfg.weight_decay if weight_decay is None else weight_decay
  if opt_cfg.name == "lars":
    return mlperf_lars(lr, decay, opt_cfg.momentum, opt_cfg.lars_eta, opt_cfg.lars_epsilon)
  return sgd_momentum(lr, decay, opt_cfg.momentum)


# ----------------------------------------------------------------------------- RMSProp

def not_batch_norm(params) -> Any:
  """True for every parameter but batch norm's (modules named *_bn, or flax's BatchNorm_*):
  tensorflow/tpu EfficientNet's L2 term skips the 'batch_normalization' variables only, so
  SE and classifier biases are decayed."""
  def decayed(path, _):
    module = str(getattr(path[-2], "key", "")) if len(path) > 1 else ""
    return not (module.endswith("_bn") or module == "bn" or module.startswith("BatchNorm"))
  return jax.tree_util.tree_map_with_path(decayed, params)


class RmsPropState(NamedTuple):
  count: jax.Array
  mean_square: Any
  momentum: Any


def tf_rmsprop(learning_rate: Callable, decay: float = 0.9, momentum: float = 0.9,
               epsilon: float = 1e-3, weight_decay: float = 0.0, mask=not_batch_norm
               ) -> optax.GradientTransformation:
  """RMSProp as TF1's RMSPropOptimizer (tf.raw_ops.ApplyRMSProp), which tensorflow/tpu uses:

    g   = grad + wd * w                 (the L2 term wd/2 * ||w||^2, masked parameters only)
    ms  = decay * ms + (1 - decay) * g^2          ms starts at 1.0 (TF1's slot initialiser)
    mom = momentum * mom + lr * g / sqrt(ms + epsilon)      epsilon inside the sqrt
    w   = w - mom

  Keras' and optax's defaults start ms at 0 and (Keras) put epsilon outside the sqrt; with
  epsilon 1e-3 the difference is large for small gradients.
  """
  def init(params):
    return RmsPropState(count=jnp.zeros([], jnp.int32),
                        mean_square=jax.tree.map(jnp.ones_like, params),
                        momentum=jax.tree.map(jnp.zeros_like, params))

  def update(grads, state, params):
    lr = learning_rate(state.count)
    decayed = mask(params) if callable(mask) else mask
    grads = jax.tree.map(lambda g, w, d: g + weight_decay * w if d else g, grads, params, decayed)
    ms = jax.tree.map(lambda s, g: decay * s + (1 - decay) * jnp.square(g),
                      state.mean_square, grads)
    mom = jax.tree.map(lambda m, g, s: momentum * m + lr * g / jnp.sqrt(s + epsilon),
                       state.momentum, grads, ms)
    return jax.tree.map(jnp.negative, mom), RmsPropState(state.count + 1, ms, mom)

  return optax.GradientTransformation(init, update)


def make_rmsprop(opt_cfg, schedule) -> optax.GradientTransformation:
  return tf_rmsprop(lambda step: schedule(step, ops=jnp), opt_cfg.decay, opt_cfg.momentum,
                    opt_cfg.epsilon, opt_cfg.weight_decay)


def l2_term(params, weight_decay: float, mask=not_batch_norm):
  """weight_decay * sum(w^2) / 2 over the masked parameters (tf.nn.l2_loss, as the
  tensorflow/tpu EfficientNet loss adds it)."""
  decayed = mask(params) if callable(mask) else mask
  leaves = [jnp.sum(jnp.square(w.astype(jnp.float32))) for w, d in
            zip(jax.tree.leaves(params), jax.tree.leaves(decayed)) if d]
  return 0.5 * weight_decay * sum(leaves)


def ema_decay(decay: float, step):
  """tf.train.ExponentialMovingAverage(decay, num_updates=step): min(decay, (1+n)/(10+n)),
  so early averages do not remember the random initialisation for long."""
  return jnp.minimum(decay, (1.0 + step) / (10.0 + step))


class AdamState(NamedTuple):
  count: jax.Array
  m: Any
  v: Any


def tf_adam(learning_rate: Callable, b1: float = 0.9, b2: float = 0.999, epsilon: float = 1e-7
            ) -> optax.GradientTransformation:
  """Adam as TF computes it (tf.raw_ops.ApplyAdam, Keras' Adam, the MLPerf Transformer's
  LazyAdamOptimizer on dense gradients):

    m = b1 * m + (1 - b1) * g;   v = b2 * v + (1 - b2) * g^2
    w = w - lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + epsilon)

  optax.adam adds epsilon to the bias-corrected sqrt(v) instead; with the rules' fixed epsilon
  1e-9 the two differ where gradients are tiny, so the TF form is the one both frameworks use.
  """
  def init(params):
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    return AdamState(count=jnp.zeros([], jnp.int32), m=zeros(), v=zeros())

  def update(grads, state, params=None):
    del params
    lr = learning_rate(state.count)
    # bias corrections in the moments' precision (float32, or float64 for float64 params)
    t = (state.count + 1).astype(jnp.result_type(jnp.float32, *jax.tree.leaves(state.m)))
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.m, grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.v, grads)
    alpha = lr * jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    updates = jax.tree.map(lambda m, v: (-alpha * m / (jnp.sqrt(v) + epsilon)).astype(m.dtype),
                           m, v)
    return updates, AdamState(state.count + 1, m, v)

  return optax.GradientTransformation(init, update)


def make_adam(opt_cfg, schedule) -> optax.GradientTransformation:
  return tf_adam(lambda step: schedule(step, ops=jnp), opt_cfg.beta_1, opt_cfg.beta_2,
                 opt_cfg.epsilon)


class AdagradState(NamedTuple):
  count: jax.Array
  sum: Any


def torch_adagrad(learning_rate: Callable, epsilon: float = 1e-8,
                  initial_accumulator_value: float = 0.0) -> optax.GradientTransformation:
  """Adagrad as torch.optim.Adagrad (and TorchRec's fused EXACT_ADAGRAD) computes it:

    sum = sum + g^2;   w = w - lr * g / (sqrt(sum) + epsilon)

  optax.adagrad puts epsilon inside the square root and skips elements whose sum is 0; the
  torch form is the reference's, and both frameworks use it."""
  def init(params):
    return AdagradState(count=jnp.zeros([], jnp.int32), sum=jax.tree.map(
        lambda p: jnp.full_like(p, initial_accumulator_value), params))

  def update(grads, state, params=None):
    del params
    lr = learning_rate(state.count)
    total = jax.tree.map(lambda s, g: s + jnp.square(g), state.sum, grads)
    updates = jax.tree.map(lambda g, s: (-lr * g / (jnp.sqrt(s) + epsilon)).astype(g.dtype),
                           grads, total)
    return updates, AdagradState(state.count + 1, total)

  return optax.GradientTransformation(init, update)


def make_adagrad(opt_cfg, schedule) -> optax.GradientTransformation:
  return torch_adagrad(lambda step: schedule(step, ops=jnp), opt_cfg.epsilon,
                       opt_cfg.initial_accumulator_value)


# ----------------------------------------------------------------------------- AdamW

def matrix_mask(params) -> Any:
  """True for the parameters AdamW decays: Megatron's param groups decay every tensor of two or
  more dimensions (weights, embeddings) and neither biases nor norm scales (1-D)."""
  return jax.tree.map(lambda p: p.ndim > 1, params)


def make_adamw(opt_cfg, schedule, clip=True) -> optax.GradientTransformation:
  """The MLPerf Llama 3.1 reference's update: the gradient clipped by its global norm
  (clip_by_global_norm's formula, the one Keras' global_clipnorm computes; Megatron divides by
  norm + 1e-6, a 1e-6 / norm relative difference in the clip factor), then torch's AdamW
  (optax.adamw computes it: lr x (m_hat / (sqrt(v_hat) + eps) + wd x w), the decay decoupled
  and scaled by the scheduled rate). `clip=False`: a caller clips the whole gradient itself."""
  adamw = optax.adamw(lambda step: schedule(step, ops=jnp), b1=opt_cfg.beta_1,
                      b2=opt_cfg.beta_2, eps=opt_cfg.epsilon, weight_decay=opt_cfg.weight_decay,
                      mask=matrix_mask)
  if not (clip and opt_cfg.clip_norm):
    return adamw
  clip_norm = opt_cfg.clip_norm
  clipper = optax.stateless(lambda grads, params=None: clip_by_global_norm(grads, clip_norm))
  return optax.chain(clipper, adamw)
