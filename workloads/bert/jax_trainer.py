"""BERT pre-training and masked-LM eval in JAX (flax + optax), behind the driver's Trainer API.

Distribution comes from workloads/parallel/jax_runtime.py, as for ResNet: batches sharded over
the data axes, parameters replicated, LAMB's moments (and the update computed from them)
sharded when weight-update sharding is on. LAMB's per-layer norms are over whole arrays, so
GSPMD adds the cross-shard reductions and the step equals the unsharded one.
"""
import collections
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax.training import train_state

from workloads.bert import input_pipeline, jax_model, spec
from workloads.optim import jax_optimizers
from workloads.parallel import jax_runtime

# tf.data only feeds the host here: keep TensorFlow off any GPU so JAX has all its memory.
input_pipeline.tf.config.set_visible_devices([], "GPU")


class TrainState(train_state.TrainState):
  dropout_key: jax.Array


def loss_and_grads(state, params, batch, train=True):
  def loss_fn(p):
    mlm_logits, nsp_logits = state.apply_fn(
        {"params": p}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
        batch["masked_lm_positions"], train=train,
        rngs={"dropout": jax.random.fold_in(state.dropout_key, state.step)})
    return jax_model.pretraining_loss(mlm_logits, nsp_logits, batch)
  return jax.value_and_grad(loss_fn)(params)


def train_step(state, batch, *, runtime):
  loss, grads = loss_and_grads(state, state.params, batch)
  grads = runtime.constrain_update(grads)            # weight-update sharding: shard the update
  state = state.apply_gradients(grads=grads)
  return state.replace(params=runtime.replicate(state.params)), loss


def eval_step(state, batch):
  mlm_logits, _ = state.apply_fn({"params": state.params}, batch["input_ids"],
                                 batch["input_mask"], batch["segment_ids"],
                                 batch["masked_lm_positions"], train=False)
  correct, count = jax_model.masked_lm_correct(mlm_logits, batch, batch["mask"])
  return jnp.stack([correct, count])


class BertTrainer:
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
    self.data_dir, self.train_examples = input_pipeline.data_source(cfg, ctx)
    self.eval_examples = cfg.data.eval_examples
    dtype = jnp.bfloat16 if cfg.train.precision == "bfloat16" else jnp.float32
    self.model = jax_model.from_config(cfg.model, dtype)
    self.schedule = spec.schedule_for(cfg)
    self.tx = jax_optimizers.make_lamb(cfg.optimizer, self.schedule)
    self._train_iter = self._eval_data = None

  # --------------------------------------------------------------- shapes and init
  def _eval_batch_size(self):
    unit = math.lcm(self.runtime.data, self.runtime.process_count)
    return math.ceil(self.cfg.data.eval_batch_size / unit) * unit

  def _batch_shapes(self, batch_size, with_mask=False):
    return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=self.runtime.batch_sharding(len(shape)))
            for k, (shape, dtype) in spec.batch_layout(self.cfg, batch_size, with_mask).items()}

  def init_params(self, rng):
    ids = jnp.zeros((1, self.cfg.data.max_seq_length), jnp.int32)
    positions = jnp.zeros((1, self.cfg.data.max_predictions_per_seq), jnp.int32)
    return self.model.init(rng, ids, ids, ids, positions)["params"]

  def _create_state(self, rng, params=None):
    init_key, dropout_key = jax.random.split(rng)
    params = self.init_params(init_key) if params is None else params
    return TrainState.create(apply_fn=self.model.apply, params=params, tx=self.tx,
                             dropout_key=dropout_key)

  def init(self):
    """Initialises (or loads the reference checkpoint into) the state on the mesh and compiles
    both steps, before run_start."""
    rng = jax.random.key(self.ctx.seed)
    shardings = self.runtime.state_shardings(jax.eval_shape(self._create_state, rng))
    params = None
    if self.cfg.data.init_checkpoint and self.cfg.data.source == "tfrecord":
      params = jax_model.load_tf1_checkpoint(
          jax.eval_shape(self.init_params, rng), input_pipeline.checkpoint_path(self.cfg, self.ctx),
          self.cfg.model.num_layers)
    self.state = jax.jit(self._create_state, out_shardings=shardings)(rng, params)
    step = functools.partial(train_step, runtime=self.runtime)
    self._train_step = jax.jit(step, donate_argnums=0, out_shardings=(
        shardings, self.runtime.replicated)).lower(
            self.state, self._batch_shapes(self.cfg.train.global_batch_size)).compile()
    self._eval_step = jax.jit(eval_step).lower(
        self.state, self._batch_shapes(self._eval_batch_size(), with_mask=True)).compile()

  # --------------------------------------------------------------- data
  def _device_batches(self, dataset):
    queue = collections.deque()
    for batch in dataset:
      queue.append(self.runtime.shard_batch(batch))
      if len(queue) == 2:
        yield queue.popleft()
    yield from queue

  def _synthetic_batches(self):
    shapes = self._batch_shapes(self.cfg.train.global_batch_size)
    batch = input_pipeline.synthetic_batch(self.cfg, self.cfg.train.global_batch_size, self.ctx.seed + 1)
    batch = {k: jax.device_put(v, shapes[k].sharding) for k, v in batch.items()}
    while True:
      yield batch

  def _train_batches(self):
    if self._train_iter is None:        # first use is after run_start: no data read before
      if self.cfg.data.source == "synthetic":
        self._train_iter = self._synthetic_batches()
      else:
        ds = input_pipeline.train_dataset(
            self.cfg, self.cfg.train.global_batch_size, seed=self.ctx.seed,
            data_dir=self.data_dir, process_index=self.runtime.process_index,
            process_count=self.runtime.process_count)
        self._train_iter = self._device_batches(ds.as_numpy_iterator())
    return self._train_iter

  # --------------------------------------------------------------- the Trainer API
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
    if self._eval_data is None:
      self._eval_data = input_pipeline.eval_dataset(
          self.cfg, self._eval_batch_size(), self.data_dir,
          process_index=self.runtime.process_index, process_count=self.runtime.process_count)
    totals = jnp.zeros(2)
    for batch in self._device_batches(self._eval_data.as_numpy_iterator()):
      totals = totals + self._eval_step(self.state, batch)
    correct, count = np.asarray(totals)
    return {"accuracy": float(correct / count), "count": int(round(count))}

  def describe(self):
    params = sum(math.prod(x.shape) for x in jax.tree.leaves(self.state.params))
    cost = self._train_step.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = float(cost.get("flops", float("nan"))) if cost else float("nan")
    return {"parameters": params,
            "train_flops_per_example": flops / self.cfg.train.global_batch_size,
            "optimizer_state_bytes_per_device": jax_runtime.per_device_bytes(self.state.opt_state),
            "collectives_in_train_step": jax_runtime.count_collectives(self._train_step.as_text())}


def make_trainer(cfg, ctx):
  return BertTrainer(cfg, ctx)
