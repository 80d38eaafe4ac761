"""ResNet training and evaluation in TensorFlow (Keras 3 model, custom loop), behind the
driver's Trainer API.

Distribution comes from workloads/parallel/tf_runtime.py (tf.distribute): one replica runs the
plain step; several run it under strategy.run, with each replica's loss scaled by the global
batch (the Keras optimizer sums gradients over replicas), batch norm pooled over replica groups,
and, with weight-update sharding, the update applied to each replica's slice of the flattened
weights (tf_runtime.ShardedUpdate). `train(n)` runs n steps inside one tf.function (a tf.range
loop over the distributed iterator), so the host syncs once per call. With one replica the
forward/backward/update is XLA-compiled (`train.jit_compile`); across replicas the step stays a
TF graph, because the cross-replica collectives inside it (batch norm, halo exchange) are
tf.distribute ops that XLA cannot compile on CPU.
"""
import math

import numpy as np
import tensorflow as tf
import keras

from workloads.optim import schedules, tf_optimizers
from workloads.parallel import tf_runtime
from workloads.resnet import input_pipeline, spec, tf_model


def cross_entropy_sum(logits, labels, num_classes, label_smoothing):
  """Summed (not averaged) label-smoothed cross entropy: callers divide by the global batch."""
  targets = tf.one_hot(labels, num_classes)
  targets = targets * (1.0 - label_smoothing) + label_smoothing / num_classes
  return tf.reduce_sum(tf.nn.softmax_cross_entropy_with_logits(targets, logits))


class ResNetTrainer:
  def __init__(self, cfg, ctx):
    self.cfg, self.ctx = cfg, ctx
    self.runtime = rt = tf_runtime.StrategyRuntime(cfg.parallel)
    self.strategy = rt.strategy
    gbs = cfg.train.global_batch_size
    if gbs % rt.data or gbs % rt.process_count:
      raise ValueError(f"train.global_batch_size={gbs} is not divisible by the {rt.data} data "
                       f"replicas and {rt.process_count} process(es)")
    self.num_devices, self.data_replicas = rt.num_replicas, rt.data
    self.mesh_description = rt.description
    gpus = tf.config.list_logical_devices("GPU")
    self.device_kind = (tf.config.experimental.get_device_details(
        tf.config.list_physical_devices("GPU")[0]).get("device_name", "GPU") if gpus else "cpu")
    self.train_examples = cfg.data.train_examples
    self.eval_examples = cfg.data.eval_examples
    self.schedule = schedules.warmup_poly_for(cfg.optimizer, cfg.train, self.train_examples)
    self.sharded = None
    self._train_iter = self._eval_data = None

  def build(self):
    """The model and optimizer, without compiling the steps (parity tests use this)."""
    cfg, rt = self.cfg, self.runtime
    dtype = "mixed_bfloat16" if cfg.train.precision == "bfloat16" else "float32"
    make_model = lambda runtime: tf_model.resnet(
        cfg.model.stage_sizes, cfg.model.num_classes, cfg.model.width, cfg.data.image_size,
        dtype=dtype, runtime=runtime)
    with self.strategy.scope():
      keras.utils.set_random_seed(self.ctx.seed)
      self.model = make_model(rt if rt.distributed else None)
      decayed = tf_model.decayed_variables(self.model)
      self.optimizer = tf_optimizers.make_optimizer(
          cfg.optimizer, self.schedule, decayed, self.model.trainable_variables)
      if rt.weight_update_sharding:
        rule, slots = self.optimizer.flat_update_rule()
        self.sharded = tf_runtime.ShardedUpdate(rt, self.model.trainable_variables, decayed,
                                                rule, slots, tf_optimizers.WarmupPoly(self.schedule))
      else:
        self.optimizer.build(self.model.trainable_variables)
    jit = cfg.train.jit_compile and not rt.distributed
    self._step = tf.function(self._train_step, jit_compile=jit)
    self._eval_step = tf.function(self._eval_batch, jit_compile=jit)

  def _loss_and_grads(self, batch):
    cfg, rt = self.cfg, self.runtime
    with tf.GradientTape() as tape:
      logits = self.model(batch["image"], training=True)
      # Summed over this replica's examples and divided by the global batch, so the sum over
      # replicas is the global mean; the k replicas of a spatial group share each example.
      loss = cross_entropy_sum(logits, batch["label"], cfg.model.num_classes,
                               cfg.optimizer.label_smoothing) / (
                                   cfg.train.global_batch_size * rt.spatial)
    return loss, tape.gradient(loss, self.model.trainable_variables)

  def _train_step(self, batch):
    loss, grads = self._loss_and_grads(batch)
    if self.sharded is not None:
      self.sharded.apply(grads)
    else:
      self.optimizer.apply(grads, self.model.trainable_variables)
    return loss

  def _eval_batch(self, batch):
    logits = self.model(batch["image"], training=False)
    correct = tf.cast(tf.argmax(logits, -1, output_type=tf.int32) == batch["label"], tf.float32)
    mask = batch["mask"]
    if self.runtime.spatial > 1:                # a spatial group counts its examples once
      mask = mask * tf.cast(self.runtime.spatial_index() == 0, tf.float32)
    return tf.stack([tf.reduce_sum(correct * mask), tf.reduce_sum(mask)])

  def _replicated(self, fn, batch):
    return self.strategy.reduce(tf_runtime.SUM, self.strategy.run(fn, args=(batch,)), axis=None)

  @tf.function
  def _train_loop(self, iterator, num_steps):
    total = tf.constant(0.0)
    for _ in tf.range(num_steps):
      total += self._replicated(self._step, next(iterator))
    return total / tf.cast(num_steps, tf.float32)

  @tf.function
  def _eval_loop(self, iterator, num_batches):
    totals = tf.zeros(2)
    for _ in tf.range(num_batches):
      totals += self._replicated(self._eval_step, next(iterator))
    return totals

  def _batch_spec(self, batch_size, with_mask=False):
    return {k: tf.TensorSpec(shape, dtype)
            for k, (shape, dtype) in spec.batch_layout(self.cfg, batch_size, with_mask).items()}

  def _eval_batch_size(self):
    """cfg.data.eval_batch_size rounded up to a multiple of the data replicas and hosts."""
    unit = math.lcm(self.runtime.data, self.runtime.process_count)
    return math.ceil(self.cfg.data.eval_batch_size / unit) * unit

  def _distributed(self, make_dataset, global_batch_size):
    """make_dataset(process_index, process_count) -> this host's batches; per replica."""
    return iter(self.runtime.distribute(make_dataset, global_batch_size))

  def _state(self):
    """Every per-device value of the training state (replicas of mirrored variables included)."""
    state = self.model.variables + (self.optimizer.variables if self.sharded is None else
                                    list(self.sharded.slots.values()) + [self.sharded.iterations])
    state = [v.value if isinstance(v, keras.Variable) else v for v in state]
    return [c for v in state for c in self.strategy.experimental_local_results(v)]

  def init(self):
    """Builds the model and optimizer, then traces and compiles the multi-step loop and the eval
    loop by running them once on zeros (no dataset exists yet), and restores the initial state."""
    self.build()
    gbs = self.cfg.train.global_batch_size
    host = lambda size: size // self.runtime.process_count
    zeros = lambda specs, size: (lambda i, n: tf.data.Dataset.from_tensors(
        {k: tf.zeros((host(size),) + tuple(s.shape[1:]), s.dtype)
         for k, s in specs.items()}).repeat())
    state = self._state()
    saved = [v.numpy() for v in state]
    self._train_loop(self._distributed(zeros(self._batch_spec(gbs), gbs), gbs), tf.constant(1))
    eval_bs = self._eval_batch_size()
    self._eval_loop(self._distributed(zeros(self._batch_spec(eval_bs, True), eval_bs), eval_bs),
                    tf.constant(1))
    for var, value in zip(state, saved):
      var.assign(value)

  def _train_iterator(self):
    if self._train_iter is None:         # first use is after run_start: no data read before
      gbs = self.cfg.train.global_batch_size
      if self.cfg.data.source == "synthetic":
        size = self.cfg.data.image_size
        gen = tf.random.Generator.from_seed(self.ctx.seed + 1)
        host = gbs // self.runtime.process_count
        batch = {"image": gen.normal((host, size, size, 3)),
                 "label": gen.uniform((host,), 0, self.cfg.model.num_classes, dtype=tf.int32)}
        make = lambda i, n: tf.data.Dataset.from_tensors(batch).repeat()
      else:
        make = lambda i, n: input_pipeline.train_dataset(
            self.cfg, gbs, seed=self.ctx.seed, data_dir=self.ctx.data_dir, process_index=i,
            process_count=n)
      self._train_iter = self._distributed(make, gbs)
    return self._train_iter

  def train(self, num_steps):
    loss = self._train_loop(self._train_iterator(), tf.constant(num_steps))
    counter = self.optimizer.iterations if self.sharded is None else self.sharded.iterations
    step = int(counter.numpy())                          # the one host sync of the call
    return {"loss": float(loss), "lr": float(self.schedule(step - 1)), "step": step}

  def evaluate(self):
    if self.cfg.data.source == "synthetic":
      raise ValueError("a synthetic run has no eval split")
    rt, eval_bs = self.runtime, self._eval_batch_size()
    if self._eval_data is None:
      self._eval_data = lambda i, n: input_pipeline.eval_dataset(
          self.cfg, eval_bs, data_dir=self.ctx.data_dir, process_index=i, process_count=n)
    batches = input_pipeline.eval_batches_per_host(self.eval_examples, eval_bs // rt.process_count,
                                                   rt.process_count)
    correct, count = self._eval_loop(self._distributed(self._eval_data, eval_bs),
                                     tf.constant(batches)).numpy()
    return {"accuracy": float(correct / count), "count": int(round(count))}

  def describe(self):
    params = int(sum(np.prod(v.shape) for v in self.model.trainable_variables))
    out = {"parameters": params}
    if not self.runtime.distributed:
      gbs = self.cfg.train.global_batch_size
      out["train_flops_per_example"] = _graph_flops(self._step, self._batch_spec(gbs)) / gbs
    out["optimizer_state_bytes_per_device"] = (
        self.sharded.state_bytes_per_replica() if self.sharded is not None else
        int(sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize for v in self.optimizer.variables
                if v is not self.optimizer.iterations)))
    if self.runtime.collective_calls:
      out["collectives_in_train_step"] = dict(self.runtime.collective_calls)
    return out


def _graph_flops(function, specs):
  """Floating-point ops of one traced train step (TF's graph profiler: what tf.function runs)."""
  graph = function.get_concrete_function(specs).graph
  opts = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
  opts["output"] = "none"
  verbosity = tf.get_logger().level
  tf.get_logger().setLevel("ERROR")         # the v1 profiler warns that it is a v1 API
  try:
    info = tf.compat.v1.profiler.profile(graph, options=opts)
  finally:
    tf.get_logger().setLevel(verbosity)
  return float(info.total_float_ops) if info else float("nan")


def make_trainer(cfg, ctx):
  return ResNetTrainer(cfg, ctx)
