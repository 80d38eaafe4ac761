"""DLRM-DCNv2 in flax (TorchRec's DLRM_DCN, the MLPerf reference's model).

  dense [B, 13] -> bottom MLP (ReLU on every layer) -> [B, D]
  sparse ids [B, sum(bag sizes)] -> the embedding slab's rows (embedding_plan.py), summed per
      feature -> [B, F, D]
  x0 = [dense, the F pooled vectors] flattened -> [B, (F + 1) D]   (dense first, as TorchRec)
  DCNv2, low rank:  x_{l+1} = x0 * (W_l (V_l x_l) + b_l) + x_l       (LowRankCrossNet)
  top MLP (ReLU on every layer but the last) -> one logit

Initialisers as the reference's: nn.Linear's uniform(+-1/sqrt(fan_in)) for the MLPs' weights
and biases, Xavier normal for V and W (flax's, truncated at 2 sd where torch's is not; bias 0),
each table uniform(+-sqrt(1/rows)).
Parameters and the slab are float32; `dtype` is the compute dtype (bf16 under mixed precision).
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from workloads.dlrm import embedding_plan
from workloads.parallel.jax_layers import remat_block
from workloads.parallel.jax_runtime import constrain


def torch_linear_init(fan_in):
  """torch.nn.Linear's default: kaiming_uniform(a=sqrt(5)) = uniform(+-1/sqrt(fan_in))."""
  bound = 1.0 / np.sqrt(fan_in)
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound,
                                                                  bound)


def dense(features, fan_in, dtype, name):
  init = torch_linear_init(fan_in)
  return nn.Dense(features, dtype=dtype, kernel_init=init, bias_init=init, name=name)


class Mlp(nn.Module):
  widths: tuple
  fan_in: int
  last_relu: bool
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    fan_in = self.fan_in
    for i, width in enumerate(self.widths):
      x = dense(width, fan_in, self.dtype, f"dense_{i}")(x)
      if self.last_relu or i < len(self.widths) - 1:
        x = nn.relu(x)
      fan_in = width
    return x


class LowRankCross(nn.Module):
  """One DCNv2 cross layer with the low-rank projection V [d, r], W [r, d] (+ bias)."""
  rank: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x0, x):
    d = x.shape[-1]
    v = nn.Dense(self.rank, use_bias=False, dtype=self.dtype, name="V",
                 kernel_init=nn.initializers.xavier_normal())
    w = nn.Dense(d, dtype=self.dtype, name="W", kernel_init=nn.initializers.xavier_normal(),
                 bias_init=nn.initializers.zeros)
    return x0 * w(v(x)) + x


def slab_rows(plan, multi_hot_sizes, ids):
  """The slab rows [B, columns] of the batch's ids (embedding_plan.lookup_rows)."""
  consts = plan.column_constants(tuple(multi_hot_sizes))
  return embedding_plan.lookup_rows(ids, {k: jnp.asarray(v) for k, v in consts.items()}, jnp)


class Embedding(nn.Module):
  """The tables in one slab (embedding_plan.py); sums each feature's bag."""
  plan: embedding_plan.Plan
  multi_hot_sizes: tuple
  dim: int
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    starts, ends, bounds = self.plan.block_bounds()

    def init(key, shape, dtype=jnp.float32):
      # each row's bound from its block, computed on the device: no host array of the
      # slab's rows (204M in the reference), and nothing at all when only shapes are traced
      row = jnp.arange(shape[0])
      block = jnp.clip(jnp.searchsorted(jnp.asarray(starts), row, side="right") - 1, 0)
      bound = jnp.where(row < jnp.asarray(ends)[block], jnp.asarray(bounds, dtype)[block], 0)
      return jax.random.uniform(key, shape, dtype, -1.0, 1.0) * bound[:, None]
    self.slab = self.param("slab", init, (self.plan.slab_rows, self.dim))

  def __call__(self, ids, found=None):
    """`found`: the slab rows of `ids` already looked up ([B, columns, D]; the sparse train
    step differentiates with respect to them, not the slab), else looked up here."""
    consts = self.plan.column_constants(self.multi_hot_sizes)
    if found is None:
      # a gather from rows split over `model`: GSPMD looks up each peer's rows and sums over
      # the peers (the vocabulary-parallel lookup)
      found = jnp.take(self.slab, slab_rows(self.plan, self.multi_hot_sizes, ids), axis=0)
    # the bags are summed in the tables' dtype (float32), as the reference's fused kernel
    # pools, and only the pooled vector is cast to the compute dtype (bf16 under mixed
    # precision): a bag of 100 ids summed in bf16 would lose its low bits at every add
    bag = jax.nn.one_hot(consts["feature"], len(self.multi_hot_sizes), dtype=found.dtype)
    pooled = jnp.einsum("bcd,cf->bfd", found, bag).astype(self.dtype)
    return constrain(pooled, ("batch", "length", "embed"))


class Dlrm(nn.Module):
  cfg: object                 # spec.ModelConfig
  plan: embedding_plan.Plan
  dtype: jnp.dtype = jnp.float32
  remat_policy: str = ""      # parallel.remat_policy, per cross layer (jax_layers)

  @nn.compact
  def __call__(self, dense_x, sparse_ids, found=None):
    """`found`: the ids' slab rows, looked up by the caller (Embedding)."""
    m = self.cfg
    bottom = Mlp(tuple(m.bottom_mlp), m.dense_features, True, self.dtype, name="bottom_mlp")
    pooled = Embedding(self.plan, tuple(m.multi_hot_sizes), m.embedding_dim, self.dtype,
                       name="embedding")(sparse_ids, found)
    x0 = jnp.concatenate([bottom(dense_x.astype(self.dtype))[:, None, :], pooled], axis=1)
    x0 = x0.reshape(x0.shape[0], -1)
    x = x0
    for layer in range(m.dcn_num_layers):
      x = remat_block(LowRankCross, self.remat_policy)(m.dcn_low_rank_dim, self.dtype,
                                                       name=f"cross_{layer}")(x0, x)
    logits = Mlp(tuple(m.top_mlp), m.interaction_dim, False, self.dtype, name="top_mlp")(x)
    return logits[:, 0].astype(jnp.promote_types(self.dtype, jnp.float32))   # f32 under bf16


def build(cfg, dtype, model_axis: int) -> Dlrm:
  from workloads.dlrm import spec
  return Dlrm(cfg.model, spec.plan(cfg, model_axis), dtype, cfg.parallel.remat_policy)
