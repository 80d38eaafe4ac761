"""DLRM-DCNv2 in Keras 3, the same model as jax_model.py (its docstring has the formulas).
Variables are named by their flax paths (`sublayers`), so one set of weights loads into both.
On a model axis the embedding slab is a ShardedWeight (tf_model_parallel.py), its rows split
over `model` as embedding_plan.py places them, looked up by the vocabulary-parallel lookup
(each peer's rows, then the sum over `model`)."""
import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops

from workloads.dlrm import embedding_plan
from workloads.parallel import tf_layers
from workloads.parallel import tf_model_parallel as mp


def torch_linear_init(fan_in):
  bound = 1.0 / np.sqrt(fan_in)
  return keras.initializers.RandomUniform(-bound, bound)


def dense(width, fan_in, dtype, name, activation=None):
  init = torch_linear_init(fan_in)
  return layers.Dense(width, activation=activation, kernel_initializer=init,
                      bias_initializer=init, dtype=dtype, name=name)


class SlabInitializer(keras.initializers.Initializer):
  """uniform(-1, 1) x each slab row's bound (embedding_plan.Plan.row_bounds)."""

  def __init__(self, bounds):
    self.bounds = bounds

  def __call__(self, shape, dtype=None):
    u = keras.random.uniform(shape, -1.0, 1.0, dtype=dtype)
    return u * ops.cast(self.bounds[:, None], u.dtype)


class Dlrm(tf_layers.BuiltInInit, keras.Model):
  """call(dense [B, 13], sparse ids [B, columns]) -> logits [B] (float32; float64 for a
  float64 model)."""

  def __init__(self, model_cfg, plan, dtype="float32", runtime=None, **kwargs):
    super().__init__(name="dlrm", dtype=dtype, **kwargs)
    m = self.cfg = model_cfg
    self.plan, self.runtime = plan, runtime
    policy = self.dtype_policy
    widths = (m.dense_features,) + tuple(m.bottom_mlp)
    self.bottom = [dense(w, f, policy, f"dense_{i}", "relu")
                   for i, (f, w) in enumerate(zip(widths[:-1], widths[1:]))]
    widths = (m.interaction_dim,) + tuple(m.top_mlp)
    self.top = [dense(w, f, policy, f"dense_{i}", "relu" if i < len(m.top_mlp) - 1 else None)
                for i, (f, w) in enumerate(zip(widths[:-1], widths[1:]))]
    self.crosses = [(layers.Dense(m.dcn_low_rank_dim, use_bias=False, name="V", dtype=policy,
                                  kernel_initializer="glorot_normal"),
                     layers.Dense(m.interaction_dim, name="W", dtype=policy,
                                  kernel_initializer="glorot_normal"))
                    for _ in range(m.dcn_num_layers)]
    self.slab = mp.sharded_or_whole(self, runtime, "slab", (plan.slab_rows, m.embedding_dim),
                                    SlabInitializer(plan.row_bounds()), path="embedding/slab")
    consts = plan.column_constants(tuple(m.multi_hot_sizes))
    self.consts = {k: v for k, v in consts.items() if k != "feature"}
    self.bag = np.eye(m.num_features)[consts["feature"]]           # [columns, features]
    # every weight made here, outside the replicas (a model axis' shards are read inside)
    for layer, fan_in in zip(self.bottom + self.top, (m.dense_features,) + tuple(
        m.bottom_mlp[:-1]) + (m.interaction_dim,) + tuple(m.top_mlp[:-1])):
      layer.build((None, fan_in))
    for v, w in self.crosses:
      v.build((None, m.interaction_dim))
      w.build((None, m.dcn_low_rank_dim))
    self.built = True

  def lookup(self, ids):
    rows = embedding_plan.lookup_rows(ids, self.consts)
    if isinstance(self.slab, mp.ShardedWeight):
      found = mp.vocab_parallel_lookup(self.runtime, self.slab, rows)
    else:
      found = tf.gather(self.slab, rows)
    # bags summed in the tables' dtype (float32), the pooled vector cast to the compute dtype
    # (as jax_model.Embedding)
    pooled = ops.einsum("bcd,cf->bfd", found, ops.cast(self.bag, found.dtype))
    return ops.cast(pooled, self.compute_dtype)

  def call(self, dense_x, ids):
    x = ops.cast(dense_x, self.compute_dtype)
    for layer in self.bottom:
      x = layer(x)
    x0 = ops.concatenate([x[:, None, :], self.lookup(ids)], axis=1)
    x0 = ops.reshape(x0, (-1, self.cfg.interaction_dim))
    x = x0
    for v, w in self.crosses:
      x = x0 * w(v(x)) + x
    for layer in self.top:
      x = layer(x)
    return ops.cast(x[:, 0], "float64" if self.compute_dtype == "float64" else "float32")

  def sublayers(self):
    """{flax module name: Keras layer or variable} (tf_layers.variables_by_path)."""
    return {"bottom_mlp": {l.name: l for l in self.bottom},
            "embedding": {"slab": self.slab},
            **{f"cross_{i}": {"V": v, "W": w} for i, (v, w) in enumerate(self.crosses)},
            "top_mlp": {l.name: l for l in self.top}}


def build(cfg, dtype="float32", runtime=None) -> Dlrm:
  """The model of the workload config `cfg` with its variables (all made in __init__)."""
  from workloads.dlrm import spec
  return Dlrm(cfg.model, spec.plan(cfg, 1 if runtime is None else runtime.model),
              dtype=dtype, runtime=runtime)
