"""What every JAX trainer shares: the Trainer API (harness/workload.py) on the device mesh of
jax_runtime.MeshRuntime. A workload's jax_trainer.py subclasses it, builds and compiles its
train state in `init`, and supplies its batch layout and datasets.

Steps are AOT-compiled jit functions over the mesh (batches sharded over the data axes, the
state donated); `train(n)` dispatches n steps with host batches put on the mesh two steps
ahead, and syncs with the host once, at the end.
"""
import collections
import math

import jax
import jax.numpy as jnp
import numpy as np

from workloads.parallel import jax_runtime


class MeshTrainer:
  # ------------------------------------------------------------------ what a workload supplies
  def batch_layout(self, batch_size, with_mask=False):
    """{name: (shape, dtype)} of a global batch (its spec.batch_layout)."""
    raise NotImplementedError

  def train_dataset(self, process_index, process_count):
    """tf.data: this host's slice of every global training batch."""
    raise NotImplementedError

  def eval_dataset(self, batch_size, process_index, process_count):
    raise NotImplementedError

  def synthetic_batch(self):
    """One global batch of the real shapes, on the mesh (reused every step)."""
    raise NotImplementedError

  # ------------------------------------------------------------------ shared
  def __init__(self, cfg, ctx):
    self.cfg, self.ctx = cfg, ctx
    self.runtime = runtime = jax_runtime.MeshRuntime(cfg.parallel)
    self.num_devices = runtime.num_devices
    self.data_replicas = runtime.data
    self.mesh_description = runtime.description
    self.device_kind = jax.devices()[0].device_kind
    gbs = cfg.train.global_batch_size
    if gbs % runtime.data:
      raise ValueError(f"train.global_batch_size={gbs} is not divisible by the "
                       f"{runtime.data} devices of the data axis")
    self._train_iter = self._eval_data = None

  def eval_batch_size(self):
    """cfg.data.eval_batch_size rounded up to a multiple of the data replicas and hosts."""
    unit = math.lcm(self.runtime.data, self.runtime.process_count)
    return math.ceil(self.cfg.data.eval_batch_size / unit) * unit

  def batch_shapes(self, batch_size, with_mask=False):
    return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=self.runtime.batch_sharding(len(shape)))
            for k, (shape, dtype) in self.batch_layout(batch_size, with_mask).items()}

  def compile_steps(self, train_step, eval_step, state_shardings):
    """AOT-compiles the train step (state donated) and the eval step for self.state."""
    self._train_step = jax.jit(train_step, donate_argnums=0, out_shardings=(
        state_shardings, self.runtime.replicated)).lower(
            self.state, self.batch_shapes(self.cfg.train.global_batch_size)).compile()
    self._eval_step = jax.jit(eval_step).lower(
        self.state, self.batch_shapes(self.eval_batch_size(), with_mask=True)).compile()

  def _device_batches(self, dataset):
    """Puts host batches on the mesh two steps ahead, so the copy overlaps compute."""
    queue = collections.deque()
    for batch in dataset:
      queue.append(self.runtime.shard_batch(batch))
      if len(queue) == 2:
        yield queue.popleft()
    yield from queue

  def _train_batches(self):
    if self._train_iter is None:        # first use is after run_start: no data read before
      if self.cfg.data.source == "synthetic":
        batch = self.synthetic_batch()
        self._train_iter = iter(lambda: batch, None)
      else:
        ds = self.train_dataset(self.runtime.process_index, self.runtime.process_count)
        self._train_iter = self._device_batches(ds.as_numpy_iterator())
    return self._train_iter

  def train(self, num_steps):
    batches = self._train_batches()
    losses = []
    for _ in range(num_steps):
      self.state, loss = self._train_step(self.state, next(batches))
      losses.append(loss)
    step = int(self.state.step)                         # the one host sync of the block
    return {"loss": float(jnp.mean(jnp.stack(losses))),
            "lr": float(self.schedule(step - 1)), "step": step}

  def evaluate(self):
    if self.cfg.data.source == "synthetic":
      raise ValueError("a synthetic run has no eval split")
    if self._eval_data is None:         # built once: its .cache() then serves every eval
      self._eval_data = self.eval_dataset(self.eval_batch_size(), self.runtime.process_index,
                                          self.runtime.process_count)
    totals = jnp.zeros(2)
    for batch in self._device_batches(self._eval_data.as_numpy_iterator()):
      totals = totals + self._eval_step(self.state, batch)     # summed over all hosts
    correct, count = np.asarray(totals)
    return {"accuracy": float(correct / count), "count": int(round(count))}

  def describe(self):
    """The compiled step's cost analysis and HLO (init compiles it, if not done yet)."""
    if not hasattr(self, "_train_step"):
      self.init()
    params = sum(math.prod(x.shape) for x in jax.tree.leaves(self.state.params))
    cost = self._train_step.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = float(cost.get("flops", float("nan"))) if cost else float("nan")
    return {"parameters": params,
            "train_flops_per_example": flops / self.cfg.train.global_batch_size,
            "optimizer_state_bytes_per_device": jax_runtime.per_device_bytes(self.state.opt_state),
            "collectives_in_train_step": jax_runtime.count_collectives(self._train_step.as_text())}
