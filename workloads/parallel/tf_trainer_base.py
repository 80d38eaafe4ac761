"""What every TensorFlow trainer shares: the Trainer API (harness/workload.py) on a
tf.distribute strategy (tf_runtime.StrategyRuntime). A workload's tf_trainer.py subclasses
StrategyTrainer and supplies only what is its own: the model, the optimizer, the loss and the
eval step (and `accumulate`/`finalize` for a metric that is not a ratio of counts). The base
owns the data plumbing: batch specs from the spec's batch layout, the datasets from the
workload's input_pipeline module (distributed per replica by the runtime, using the layout's
logical axis names), the synthetic batch, the compute dtype, and the loops.

One replica runs the plain step, XLA-compiled (`train.jit_compile`). Several run it under
`strategy.run` as a TF graph: the cross-replica collectives inside the step (batch norm, halo
exchange, the gradient sum) are tf.distribute ops, which XLA does not compile on CPU. Each
replica's loss is its share of the global loss, the trainer sums gradients over replicas, and
the optimizer (or, with weight-update sharding, tf_runtime.ShardedUpdate) applies the sum.
`train(n)` runs n steps inside one tf.function (a tf.range loop over the distributed
iterator), so the host syncs once per call.

On a model axis (tf_model_parallel.py) the model's layers make sharded weights; the step
differentiates them beside the Keras weights (`watch_variables`), sums a shard's gradient over
its data peers and a whole weight's over all replicas divided by the model size (model peers
see the same examples), clips both by one global norm where the optimizer clips, and updates
the shards with tf_runtime.ShardedUpdate (the sliced update weight-update sharding uses too).

Evaluation runs in three phases, as in jax_trainer_base.py: `eval_step(batch)` per replica;
`accumulate(acc, outputs)`; `finalize(acc)`. By default eval_step returns [correct, counted],
the whole eval split runs in one tf.function summing them over replicas (one host sync), and
finalize divides (spec.evaluator: CountEvaluator). With an evaluator `on_host` (BLEU,
detections) every batch's per-replica outputs are gathered
(strategy.gather: from every worker, in replica order; a spatial group's duplicates dropped)
and accumulated on the host; accumulate drops the examples whose 'mask' is 0.
"""
import abc
import collections
import math
import os

import keras
import numpy as np
import tensorflow as tf

from harness import pipeline as gpipe
from harness.workload import Description, PipelineDescription, is_synthetic
from workloads.common import moe
from workloads.common.batching import eval_batches_per_host, host_batch_size
from workloads.parallel import tf_layers, tf_pipeline, tf_runtime
from workloads.parallel.trainer_base import WorkloadTrainer
from workloads.parallel.tf_flops import graph_flops, model_flops


class StrategyTrainer(WorkloadTrainer):
  # A pipelined loss (tf_pipeline.run) sets these while it is traced, for describe's GPipe
  # figures: the ops of the forward pass, and the bytes its stage shifts copy per step.
  forward_ops: int | None = None
  shifted_bytes: int = 0

  # ------------------------------------------------------------------ what a workload supplies
  @abc.abstractmethod
  def make_model(self, runtime):
    """The Keras model; `runtime` is the StrategyRuntime when there are several replicas."""

  @abc.abstractmethod
  def make_optimizer(self):
    """-> (a tf_optimizers optimizer, its Keras learning-rate schedule)."""

  @abc.abstractmethod
  def loss_and_grads(self, batch):
    """This replica's share of the global loss and its gradients."""

  def after_update(self):
    """Inside the train step, after the optimizer's update (EfficientNet's weight average).
    Default: nothing (a body of a docstring alone left AutoGraph an empty `with` block: it
    warned, on every TF run, that it could not transform this method)."""
    return None

  def extra_state(self):
    """Training state beyond the model's and the optimizer's variables (EfficientNet's averaged
    weights), each a variable: init restores it after tracing the loops on zeros."""
    return []

  def parameter_sizes(self):
    """{flax parameter path ('encoder/layer_0/...'): element count} of the built model: the
    paths spec.pipeline_layers names (tf_layers.params_by_path)."""
    return {"/".join(path): int(np.prod(getattr(var, "full_shape", var.shape)))
            for path, var in tf_layers.params_by_path(self.model).items()}

  @abc.abstractmethod
  def eval_step(self, batch):
    """This replica's outputs for its part of an eval batch ([correct, counted] for a
    CountEvaluator, padding masked)."""

  # ------------------------------------------------------------------ shared
  def __init__(self, cfg, ctx):
    rt = tf_runtime.StrategyRuntime(cfg.parallel, cfg.train.global_batch_size)
    gbs = cfg.train.global_batch_size
    if gbs % rt.data or gbs % rt.process_count:
      raise ValueError(f"train.global_batch_size={gbs} is not divisible by the {rt.data} data "
                       f"replicas and {rt.process_count} process(es)")
    self._build_common(cfg, ctx, rt, rt.pipelined)
    self.strategy = rt.strategy
    # stages own their weights: each stage's made on its device (data replica 0's), with their
    # optimizer slots beside them (tf_pipeline.on_stage_device); None without stages
    self.stage_placement = (list(zip(rt.pipeline_devices[:rt.stage],
                                     gpipe.stage_ranges(self.stage_cut)))
                            if self.stage_cut and rt.stage > 1 else None)
    gpus = tf.config.list_logical_devices("GPU")
    self.device_kind = (tf.config.experimental.get_device_details(
        tf.config.list_physical_devices("GPU")[0]).get("device_name", "GPU") if gpus else "cpu")
    self.dtype = "mixed_bfloat16" if cfg.train.precision == "bfloat16" else "float32"
    self.sharded = None
    # a workload's change to every host batch before it is split over replicas (SSD pads its
    # image's rows for spatial slabs); None: the batches as the input pipeline gives them
    self.host_batch_map = None

  # ------------------------------------------------------------------ data
  def batch_spec(self, batch_size, with_mask=False):
    return {k: tf.TensorSpec(shape, dtype) for k, (shape, dtype, _) in
            self.spec.batch_layout(self.cfg, batch_size, with_mask).items()}

  def batch_axes(self, with_mask=False):
    return {k: axes for k, (_, _, axes) in
            self.spec.batch_layout(self.cfg, 1, with_mask).items()}

  def train_dataset(self, process_index, process_count):
    """This host's slice of every global training batch (real, mini or synthetic data)."""
    cfg, gbs = self.cfg, self.cfg.train.global_batch_size
    if is_synthetic(cfg):
      host = host_batch_size(gbs, process_count)
      batch = self.pipeline.synthetic_batch(cfg, host, self.ctx.seed + 1)
      specs = self.batch_spec(host)
      return tf.data.Dataset.from_tensors(
          {k: tf.constant(v, specs[k].dtype) for k, v in batch.items()}).repeat()
    return self.pipeline.train_dataset(cfg, gbs, self.ctx.seed, self.data_dir, process_index,
                                       process_count)

  def eval_batches(self, batch_size):
    """Eval batches every host runs (the same count on all hosts)."""
    hosts = self.runtime.input_hosts      # hosts of one data shard read the same batches
    return eval_batches_per_host(self.eval_examples, batch_size // hosts, hosts)

  def build(self):
    """The model and optimizer, without compiling the steps (parity tests use this)."""
    rt = self.runtime
    rt.sharded_weights = []               # the model's layers make them (tf_model_parallel)
    rt.param_axes = self.spec.param_axes  # ... where the workload's table splits a weight
    with self.strategy.scope():
      keras.utils.set_random_seed(self.ctx.seed)
      self.model = self.make_model(rt if rt.distributed else None)
      self.optimizer, schedule = self.make_optimizer()
      if rt.weight_update_sharding:
        variables = self.model.trainable_variables
        self.sharded = tf_runtime.ShardedUpdate(
            rt, [lambda v=v: v for v in variables], self.optimizer,
            [self.optimizer._use_weight_decay(v) for v in variables],  # pylint: disable=protected-access
            group="replicas", schedule=schedule)
      else:
        self.optimizer.build(self.model.trainable_variables)
    # the shards of model/expert-parallel weights: the same update, on each replica's shards
    # (split over their data peers with weight-update sharding), at the whole weights' step;
    # a trust ratio's norm summed over the peers of each shard's own axis
    self.model_update = (tf_runtime.ShardedUpdate(
        rt, [w.component for w in rt.sharded_weights], self.optimizer,
        [self.decayed_shard(w.name) for w in rt.sharded_weights],
        group="data" if rt.weight_update_sharding and rt.data > 1 else None,
        norm_axis=[w.axis for w in rt.sharded_weights], name="shards")
                         if rt.sharded_weights else None)
    jit = self.cfg.train.jit_compile and not rt.distributed
    # a pipeline's ops are placed on its stage devices: XLA would put them on one; its eval
    # reads each stage's weights from their own devices, which one XLA program cannot
    self._step = tf.function(self._train_step, jit_compile=jit and not rt.pipelined)
    self._eval_step = tf.function(self.eval_step,
                                  jit_compile=jit and self.stage_placement is None)

  def parameter_count(self):
    """Trainable parameters of the built model (no step traced): what the gradient
    all-reduce moves (`simulate --workload`)."""
    if not hasattr(self, "model"):
      self.build()
    return int(sum(np.prod(v.shape) for v in self.model.trainable_variables))

  @staticmethod
  def decayed_shard(name):
    """Whether weight decay (and LAMB's trust ratio) applies to a sharded weight."""
    return not any(part in name for part in ("bias", "norm", "LayerNorm"))

  def watch_variables(self, tape):
    """The variables a replica differentiates: the Keras model's trainable ones, then its
    shards of the model-parallel weights (ON_READ variables: watched here)."""
    shards = [w.component() for w in self.runtime.sharded_weights]
    for shard in shards:
      tape.watch(shard)
    return self.model.trainable_variables + shards

  def step_outputs(self):
    """The train step's outputs in zeros: its loss (float64, the train loop's totals); a
    workload whose step reports more (an MoE model's router figures) returns its structure."""
    return tf.constant(0.0, tf.float64)

  def _train_step(self, batch):
    """-> this replica's loss, or {'loss', ...} when loss_and_grads reports more."""
    loss, grads = self.loss_and_grads(batch)
    if isinstance(loss, dict):
      loss = {**loss, "loss": self._apply(loss["loss"], grads)}
    else:
      loss = self._apply(loss, grads)
    self.after_update()
    return loss

  def _apply(self, loss, grads):
    """Sums the replicas' gradients and applies them; -> the replica's loss share."""
    rt = self.runtime
    if self.model_update is not None:
      whole, shards = self.summed_gradients(grads)
      clip = getattr(self.optimizer, "global_clipnorm", None)
      if clip:              # LAMB's global norm covers the shards too (the shards' squares
        squares = tf.add_n([tf.reduce_sum(tf.square(g)) for g in whole])   # summed over model)
        norm = tf.sqrt(squares + tf.add_n([rt.axis_sum(tf.reduce_sum(tf.square(g)), w.axis)
                                           for g, w in zip(shards, rt.sharded_weights)]))
        scale = clip * tf.minimum(1.0 / norm, 1.0 / tf.cast(clip, norm.dtype))
        whole, shards = [g * scale for g in whole], [g * scale for g in shards]
      if self.sharded is not None:          # weight-update sharding of the whole weights too
        step = self.sharded.iterations + 1
        lr = self.sharded.schedule(self.sharded.iterations)
        self.sharded.apply(whole)
      else:
        step = tf.cast(self.optimizer.iterations + 1, tf.int64)
        lr = self.optimizer.learning_rate             # at this step, before the update
        self.optimizer.apply(whole, self.model.trainable_variables)
      self.model_update.apply(shards, step, lr)
      return loss / rt.copies
    grads = rt.all_sum(grads)                  # summed over replicas, before any clipping
    if self.sharded is not None:
      self.sharded.apply(grads)
    else:
      self.optimizer.apply(grads, self.model.trainable_variables)
    return loss

  def summed_gradients(self, grads):
    """In replica context, with sharded weights: (the whole weights' gradients, the shards'),
    each summed as its update needs. Model peers compute the same loss on the same examples,
    so a whole weight's gradient is the same on each and its sum over all replicas is
    `copies` times the data sum; a shard's is summed over its data peers (the replicas
    holding the same shard), of which an expert's include model peers: divided by theirs."""
    rt = self.runtime
    n = len(self.model.trainable_variables)
    whole = [g / rt.copies for g in rt.all_sum(grads[:n])]
    shards = [rt.data_sum(g, w.axis) / rt.shard_copies(w.axis)
              for g, w in zip(grads[n:], rt.sharded_weights)]
    return whole, shards

  def _replicated(self, fn, batch):
    outputs = self.strategy.run(fn, args=(batch,))
    return tf.nest.map_structure(
        lambda x: self.strategy.reduce(tf_runtime.SUM, x, axis=None), outputs)

  @tf.function
  def _train_loop(self, iterator, num_steps):
    """-> the step outputs summed over replicas and steps (float64: a float64 model's too)."""
    total = self.step_outputs()
    for _ in tf.range(num_steps):
      total = tf.nest.map_structure(lambda t, x: t + tf.cast(x, tf.float64), total,
                                    self._replicated(self._step, next(iterator)))
    return total

  @tf.function
  def _eval_loop(self, iterator, num_batches):
    totals = tf.zeros(2)
    for _ in tf.range(num_batches):
      totals += self._replicated(self._eval_step, next(iterator))
    return totals

  @tf.function
  def _eval_gather(self, iterator):
    """One eval batch's outputs from every replica of every worker, in replica order."""
    outputs = self.strategy.run(self._eval_step, args=(next(iterator),))
    if not self.runtime.distributed:
      return outputs
    return tf.nest.map_structure(lambda x: self.strategy.gather(x, axis=0), outputs)

  def _drop_spatial_duplicates(self, outputs):
    """Replica r = (d * model + m) * spatial + j: keep m = j = 0, one copy of its data shard's
    examples (its model peers and spatial slabs see the same ones)."""
    k = self.runtime.copies
    if k == 1:
      return outputs
    def first_slab(x):
      x = x.reshape((self.runtime.data, k, -1) + x.shape[1:])
      return x[:, 0].reshape((-1,) + x.shape[3:])
    return {key: first_slab(v) for key, v in outputs.items()}

  def eval_batch_size(self):
    """cfg.data.eval_batch_size rounded up to a multiple of the data replicas and hosts."""
    unit = math.lcm(self.runtime.data, self.runtime.process_count)
    return math.ceil(self.cfg.data.eval_batch_size / unit) * unit

  def _distributed(self, make_dataset, global_batch_size, with_mask=False):
    """make_dataset(process_index, process_count) -> this host's batches; per replica."""
    return iter(self.runtime.distribute(self._mapped(make_dataset), global_batch_size,
                                        self.batch_axes(with_mask)))

  def _mapped(self, make_dataset):
    if self.host_batch_map is None:
      return make_dataset
    return lambda i, n: make_dataset(i, n).map(self.host_batch_map)

  def _state(self):
    """Every per-device value of the training state (replicas of mirrored variables included)."""
    state = self.model.variables + (self.optimizer.variables if self.sharded is None else
                                    list(self.sharded.slots.values()) + [self.sharded.iterations])
    state = [v.value if isinstance(v, keras.Variable) else v for v in state]
    state += [w.variable for w in self.runtime.sharded_weights]
    state += [getattr(v, "value", v) for v in self.extra_state()]
    local = [c for v in state for c in self.strategy.experimental_local_results(v)]
    return local + (self.model_update.state() if self.model_update is not None else [])

  def init(self):
    """Builds the model and optimizer, then traces and compiles the multi-step loop and (unless
    the data is synthetic) the eval loop by running them once on zeros (no dataset exists yet),
    and restores the initial state."""
    self.build()
    hosts = self.runtime.input_hosts

    def zeros(batch_size, with_mask=False):
      specs = self.batch_spec(batch_size // hosts, with_mask)
      batch = {k: tf.zeros(s.shape, s.dtype) for k, s in specs.items()}
      return lambda i, n: tf.data.Dataset.from_tensors(batch).repeat()

    state = self._state()
    saved = [v.numpy() for v in state]
    gbs, eval_bs = self.cfg.train.global_batch_size, self.eval_batch_size()
    self._train_loop(self._distributed(zeros(gbs), gbs), tf.constant(1))
    # a synthetic run has no eval split (evaluate() refuses it): its eval loop would be traced
    # and never run (the JAX trainers skip compiling it too)
    if self.cfg.data.source != "synthetic":
      eval_batches = self._distributed(zeros(eval_bs, True), eval_bs, True)
      if self.eval_on_host:
        self._eval_gather(eval_batches)
      else:
        self._eval_loop(eval_batches, tf.constant(1))
    for var, value in zip(state, saved):
      var.assign(value)

  @property
  def iterations(self):
    return self.optimizer.iterations if self.sharded is None else self.sharded.iterations

  def train(self, num_steps=None, *, samples=None):
    """num_steps steps in one tf.function (its loop cannot stop inside: a signal stops the run
    when it returns). A step trains the global batch: `samples` (Trainer's, for variable
    samples) is not taken."""
    if samples is not None or num_steps is None:
      raise ValueError("a TF trainer trains whole steps of the global batch: train(num_steps)")
    if self._train_iter is None:         # first use is after run_start: no data read before
      self._train_iter = self._distributed(self.train_dataset, self.cfg.train.global_batch_size)
    total = self._train_loop(self._train_iter, tf.constant(num_steps))
    step = int(self.iterations.numpy())                  # the one host sync of the call
    loss = total["loss"] if isinstance(total, dict) else total
    metrics = {"loss": float(loss) / num_steps, "lr": float(self.schedule(step - 1)),
               "step": step}
    if isinstance(total, dict) and "router" in total:    # an MoE model's router figures
      router = {k: v.numpy() for k, v in total["router"].items()}
      router["z_loss"] /= num_steps
      router["balance_loss"] /= num_steps
      metrics["progress"], metrics["scalars"] = moe.report(router)
    return metrics

  def evaluate(self):
    if is_synthetic(self.cfg):
      raise ValueError("a synthetic run has no eval split")
    eval_bs = self.eval_batch_size()
    if self._eval_data is None:         # built once: its .cache() then serves every eval
      make = lambda i, n: self.pipeline.eval_dataset(self.cfg, eval_bs, self.data_dir, i, n)
      self._eval_data = self.runtime.distribute(self._mapped(make), eval_bs,
                                                self.batch_axes(True))
    iterator, batches = iter(self._eval_data), self.eval_batches(eval_bs)
    if not self.eval_on_host:
      return self.finalize(self._eval_loop(iterator, tf.constant(batches)).numpy())
    acc = None
    for _ in range(batches):
      self.stop_check()                 # between two batches (eager TF: nothing in flight)
      outputs = {k: v.numpy() for k, v in self._eval_gather(iterator).items()}
      acc = self.accumulate(acc, self._drop_spatial_duplicates(outputs))
    return self.finalize(acc)

  def _describe_pipeline(self):
    """GPipe's figures, as jax_trainer_base's: the stage cut, iterations and bubble, the
    activation bytes kept for the backward pass with and without tf.recompute_grad (from the
    traced step's graph: tf_pipeline.kept_for_backward_bytes; TF has no memory analysis of a
    CPU program), and the bytes shifted between stage devices per step (forward and back);
    per device as the mean over the stage x data devices."""
    rt, spec, parallel = self.runtime, self.spec, self.cfg.parallel
    sizes = self.parameter_sizes()
    specs = self.batch_spec(self.cfg.train.global_batch_size)
    kept, saved = {}, parallel.remat
    try:
      for remat in (True, False):
        parallel.remat = remat
        graph = tf.function(self.loss_and_grads).get_concrete_function(specs).graph
        kept[remat] = tf_pipeline.kept_for_backward_bytes(graph, self.forward_ops)
    finally:
      parallel.remat = saved
    iterations, n = gpipe.iterations(rt.stage, rt.microbatches), rt.num_devices
    return PipelineDescription(
        stages=rt.stage, microbatches=rt.microbatches, iterations=iterations,
        bubble_fraction=gpipe.bubble_fraction(rt.stage, rt.microbatches),
        cut=gpipe.stage_summary(spec.pipeline_layers(self.cfg), self.stage_cut, sizes),
        remat=saved, activation_bytes_remat=kept[True] // n,
        activation_bytes_no_remat=kept[False] // n,
        activation_source="forward tensors the traced backward reads, mean per device",
        permute_bytes_per_step=2 * self.shifted_bytes // n,
        shift_source="cross-device copies of micro-batches, mean per device")

  def describe(self, pipeline=True):
    """Works before init: one replica needs only the built model and the traced (not compiled
    or run) step; several need the traced loop, whose collectives it counts."""
    if not hasattr(self, "model"):
      too_large = self._shapes_if_too_large() if not self.runtime.distributed else None
      if too_large is not None:
        return too_large
      self.init() if self.runtime.distributed else self.build()
    shards = self.runtime.sharded_weights
    slots = [v for v in self.optimizer.variables if v is not self.optimizer.iterations]
    info = Description(
        parameters=int(sum(np.prod(v.shape) for v in self.model.trainable_variables)
                       + sum(np.prod(w.full_shape) for w in shards)),
        parameter_bytes_per_device=int(
            variable_bytes(self.model.trainable_variables, self.stage_placement)
            + sum(w.bytes_per_replica() for w in shards)),
        optimizer_state_bytes_per_device=(
            self.sharded.state_bytes_per_replica() if self.sharded is not None else
            variable_bytes(slots, self.stage_placement))
        + (self.model_update.state_bytes_per_replica() if self.model_update is not None else 0))
    if self.stage_placement:       # what each device held before stages owned their weights
      info.parameter_bytes_without_stages = variable_bytes(self.model.trainable_variables)
    if self.runtime.distributed:
      info.flops_missing = "not profiled across TF replicas (describe on 1 device)"
    else:
      gbs = self.cfg.train.global_batch_size
      specs = self.batch_spec(gbs)
      info.train_flops_per_example = graph_flops(self._step, specs) / gbs
      info.model_flops_per_example = model_flops(
          self._step.get_concrete_function(specs).graph) / gbs
    if self.stage_cut and pipeline:
      info.pipeline = self._describe_pipeline()
    if self.runtime.collective_calls:     # counted while tracing, once per replica
      n = self.runtime.num_replicas
      info.collectives_in_train_step = {k: v // n for k, v in
                                        self.runtime.collective_calls.items()}
      info.collective_bytes_in_train_step = {k: v // n for k, v in
                                             self.runtime.collective_bytes.items()}
      info.emulated_collectives = self.runtime.emulated_costs(info.collective_bytes_in_train_step)
    return info


  # Of this host's memory, the most a model and its optimizer state may take for describe to
  # build them (the rest: the traced step's temporaries, TF and the interpreter).
  DESCRIBE_MEMORY_FRACTION = 0.5

  def _shapes_if_too_large(self):
    """describe's figures from shapes alone when the model and its optimizer state would not
    fit this host (Llama 3.1 8B: 96 GB in float32 with AdamW's moments): the model built in a
    Keras StatelessScope that never initialises a variable (shapes and dtypes only, nothing
    allocated), the optimizer's slots counted by its SLOTS; None when they fit, or when the
    model cannot be built from shapes (describe then builds them and traces the step)."""
    # Keras lists a variable made in the scope for initialisation by a later scope that
    # initialises: the list is put back as it was
    from keras.src.backend.common import global_state  # pylint: disable=import-outside-toplevel
    pending = list(global_state.get_global_attribute("uninitialized_variables") or [])
    try:
      with keras.StatelessScope(initialize_variables=False), self.strategy.scope():
        model = self.make_model(None)
    except ValueError:            # a variable made from a value, not an initializer
      return None
    finally:
      global_state.set_global_attribute("uninitialized_variables", pending)
    params = variable_bytes(model.trainable_variables)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if 3 * params <= self.DESCRIBE_MEMORY_FRACTION * memory:   # weights and Adam's 2 moments
      return None
    # the optimizer's slots: its own count a variable (Keras keys a variable it builds slots
    # for by its value, which a variable from shapes does not have)
    saved, self.model = getattr(self, "model", None), model     # make_optimizer reads it
    try:
      optimizer, _ = self.make_optimizer()
    finally:
      if saved is None:
        del self.model
      else:
        self.model = saved
    state = params * len(optimizer.SLOTS)
    if params + state <= self.DESCRIBE_MEMORY_FRACTION * memory:
      return None
    return Description(
        parameters=int(sum(np.prod(v.shape) for v in model.trainable_variables)),
        parameter_bytes_per_device=params, optimizer_state_bytes_per_device=state,
        flops_missing=(f"shapes only: the model and its optimizer state ({(params + state) / 1e9:.1f}"
                       f" GB) exceed half this host's memory ({memory / 1e9:.1f} GB), so the "
                       "step is not traced"))


def variable_bytes(variables, stage_placement=None) -> int:
  """Bytes of `variables` a device holds: all of them (one replica, or mirrored on each), or,
  where pipeline stages own their weights, the most any one device holds, read from the
  variables' own devices."""
  if not stage_placement:
    return int(sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize for v in variables))
  held = collections.Counter()
  for v in variables:
    held[variable_device(v)] += int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
  return max(held.values(), default=0)


def variable_device(variable) -> str:
  """The device a (Keras or TF) variable lives on, in TF's canonical spelling."""
  return getattr(variable, "value", variable).device
