"""ResNet training and evaluation in TensorFlow (Keras 3 model, custom loop), behind the
driver's Trainer API.

The train step is XLA-compiled (`train.jit_compile`), and `train(n)` runs n steps inside one
tf.function (a tf.range loop over the dataset iterator), so Python dispatch is off the hot path
and the host syncs once per call.
"""

import numpy as np
import tensorflow as tf
import keras

from workloads.optim import schedules, tf_optimizers
from workloads.resnet import input_pipeline, spec, tf_model


def cross_entropy(logits, labels, num_classes, label_smoothing):
  targets = tf.one_hot(labels, num_classes)
  targets = targets * (1.0 - label_smoothing) + label_smoothing / num_classes
  return tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(targets, logits))


class ResNetTrainer:
  def __init__(self, cfg, ctx):
    self.cfg, self.ctx = cfg, ctx
    self.num_devices = self.data_replicas = 1
    self.mesh_description = "data=1"
    gpus = tf.config.list_logical_devices("GPU")
    self.device_kind = (tf.config.experimental.get_device_details(
        tf.config.list_physical_devices("GPU")[0]).get("device_name", "GPU") if gpus else "cpu")
    self.train_examples = cfg.data.train_examples
    self.eval_examples = cfg.data.eval_examples
    self.schedule = schedules.warmup_poly_for(cfg.optimizer, cfg.train, self.train_examples)
    self._train_iter = self._eval_data = None

  def build(self):
    """The model and optimizer, without compiling the steps (parity tests use this)."""
    cfg = self.cfg
    keras.utils.set_random_seed(self.ctx.seed)
    dtype = "mixed_bfloat16" if cfg.train.precision == "bfloat16" else "float32"
    self.model = tf_model.resnet(cfg.model.stage_sizes, cfg.model.num_classes, cfg.model.width,
                                 cfg.data.image_size, dtype=dtype)
    self.optimizer = tf_optimizers.make_optimizer(
        cfg.optimizer, self.schedule, tf_model.decayed_variables(self.model),
        self.model.trainable_variables)
    self.optimizer.build(self.model.trainable_variables)
    self._step = tf.function(self._train_step, jit_compile=cfg.train.jit_compile)
    self._eval_step = tf.function(self._eval_batch, jit_compile=cfg.train.jit_compile)

  def _loss_and_grads(self, batch):
    cfg = self.cfg
    with tf.GradientTape() as tape:
      logits = self.model(batch["image"], training=True)
      loss = cross_entropy(logits, batch["label"], cfg.model.num_classes,
                           cfg.optimizer.label_smoothing)
    return loss, tape.gradient(loss, self.model.trainable_variables)

  def _train_step(self, batch):
    loss, grads = self._loss_and_grads(batch)
    self.optimizer.apply(grads, self.model.trainable_variables)
    return loss

  def _eval_batch(self, batch):
    logits = self.model(batch["image"], training=False)
    correct = tf.cast(tf.argmax(logits, -1, output_type=tf.int32) == batch["label"], tf.float32)
    return tf.stack([tf.reduce_sum(correct * batch["mask"]), tf.reduce_sum(batch["mask"])])

  @tf.function
  def _train_loop(self, iterator, num_steps):
    total = tf.constant(0.0)
    for _ in tf.range(num_steps):
      total += self._step(next(iterator))
    return total / tf.cast(num_steps, tf.float32)

  def _batch_spec(self, batch_size, with_mask=False):
    return {k: tf.TensorSpec(shape, dtype)
            for k, (shape, dtype) in spec.batch_layout(self.cfg, batch_size, with_mask).items()}

  def init(self):
    """Builds the model and optimizer, then traces and compiles the multi-step loop and the eval
    step by running them once on zeros (no dataset exists yet), and restores the initial state."""
    self.build()
    gbs, eval_bs = self.cfg.train.global_batch_size, self.cfg.data.eval_batch_size
    zeros = lambda specs: {k: tf.zeros(s.shape, s.dtype) for k, s in specs.items()}
    state = self.model.variables + self.optimizer.variables
    saved = [v.numpy() for v in state]
    dummy = iter(tf.data.Dataset.from_tensors(zeros(self._batch_spec(gbs))).repeat())
    self._train_loop(dummy, tf.constant(1))
    self._eval_step(zeros(self._batch_spec(eval_bs, with_mask=True)))
    for var, value in zip(state, saved):
      var.assign(value)

  def _train_iterator(self):
    if self._train_iter is None:         # first use is after run_start: no data read before
      gbs = self.cfg.train.global_batch_size
      if self.cfg.data.source == "synthetic":
        size = self.cfg.data.image_size
        gen = tf.random.Generator.from_seed(self.ctx.seed + 1)
        batch = {"image": gen.normal((gbs, size, size, 3)),
                 "label": gen.uniform((gbs,), 0, self.cfg.model.num_classes, dtype=tf.int32)}
        ds = tf.data.Dataset.from_tensors(batch).repeat()
      else:
        ds = input_pipeline.train_dataset(self.cfg, gbs, seed=self.ctx.seed,
                                          data_dir=self.ctx.data_dir)
      self._train_iter = iter(ds)
    return self._train_iter

  def train(self, num_steps):
    loss = self._train_loop(self._train_iterator(), tf.constant(num_steps))
    step = int(self.optimizer.iterations.numpy())       # the one host sync of the call
    return {"loss": float(loss), "lr": float(self.schedule(step - 1)), "step": step}

  def evaluate(self):
    if self.cfg.data.source == "synthetic":
      raise ValueError("a synthetic run has no eval split")
    if self._eval_data is None:
      self._eval_data = input_pipeline.eval_dataset(self.cfg, self.cfg.data.eval_batch_size,
                                                    data_dir=self.ctx.data_dir)
    totals = tf.zeros(2)
    for batch in self._eval_data:
      totals += self._eval_step(batch)
    correct, count = totals.numpy()
    return {"accuracy": float(correct / count), "count": int(round(count))}

  def describe(self):
    params = int(sum(np.prod(v.shape) for v in self.model.trainable_variables))
    return {"parameters": params,
            "train_flops_per_example": _graph_flops(self._step, self._batch_spec(
                self.cfg.train.global_batch_size)) / self.cfg.train.global_batch_size}


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
