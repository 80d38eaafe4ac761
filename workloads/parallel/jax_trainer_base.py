"""What every JAX trainer shares: the Trainer API (harness/workload.py) on the device mesh of
jax_runtime.MeshRuntime. A workload's jax_trainer.py subclasses MeshTrainer and supplies only
what is its own: the model and train state (`init`, which calls `compile_steps`), the loss in
its train step, its eval step, and, for a metric that is not a ratio of counts, `accumulate`
and `finalize`. The base owns the data plumbing: batch layouts (with logical axis names, laid
out on the mesh by the runtime), the datasets from the workload's input_pipeline module, the
synthetic batch, the compute dtype, the train loop and the eval loop.

Steps are AOT-compiled jit functions over the mesh (batches sharded per their logical axes,
the state donated); `train(n)` dispatches n steps with host batches put on the mesh two steps
ahead, and syncs with the host once, at the end.

Evaluation runs in three phases (TF Model Garden's validation_step -> aggregate_logs ->
reduce_aggregated_logs):
  eval_step(state, batch) -> outputs      on device, per batch (compiled once);
  accumulate(acc, outputs) -> acc         per batch (spec.evaluator: harness.workload.Evaluator);
  finalize(acc) -> {metric: value, 'count': n}.
By default eval_step returns [correct, counted] summed over the global batch, accumulate adds
on device (no host sync per batch) and finalize divides (CountEvaluator). A workload whose
metric needs the examples themselves (BLEU statistics, detections) has an evaluator with
`on_host = True`: every batch's
outputs come to the host, gathered from every process (each host sees the whole global batch,
padding included: accumulate drops the examples whose 'mask' is 0), so every eval example
counts exactly once.
"""
import abc
import collections
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from harness import pipeline as gpipe
from harness.workload import Description, PipelineDescription, is_synthetic
from workloads.common import host_tf, moe
from workloads.parallel import jax_flops, jax_runtime, jax_stage_weights
from workloads.parallel.trainer_base import WorkloadTrainer

# tf.data only feeds the host here, and only where a pipeline reads files (workloads/common/
# host_tf.py): TensorFlow, if it loads, is kept off any GPU so JAX has all their memory.
host_tf.keep_off_accelerators()

# XLA's backend optimisation level 0 (LLVM's passes skipped, the HLO and its cost analysis as
# they are): for programs that run once or never (initial_state, describe's compile_steps).
LEVEL_0 = {"xla_backend_optimization_level": 0}


def apply_update(state, grads, runtime, **fields):
  """How every JAX train step ends, after the workload's loss and gradients: the update
  sharded over the data axis under weight-update sharding (constrain_update), the optimizer
  applied (flax TrainState.apply_gradients, `fields`: what else the step replaces, e.g. batch
  statistics), and the parameters laid out again as the model reads them."""
  grads = runtime.constrain_update(grads)
  state = state.apply_gradients(grads=grads, **fields)
  return state.replace(params=runtime.restore_param_layout(state.params))


class MeshTrainer(WorkloadTrainer):
  # The flax module (`pipelined` binds it into a workload's GPipe loss): every workload's
  # __init__ builds it, as it sets `schedule` (trainer_base.WorkloadTrainer).
  built_with = ("model",)
  model: object

  # ------------------------------------------------------------------ what a workload supplies
  @abc.abstractmethod
  def create_state(self, rng):
    """The train state (params, optimizer state, ...) from a PRNG key; init jits it."""

  @abc.abstractmethod
  def train_step_fn(self, remat=None):
    """The train step, (state, batch) -> (state, loss): the workload's loss and gradients,
    then `apply_update` (below). `remat` overrides parallel.remat (describe compiles both)."""

  def layer_profile(self, rows):
    """[(FLOPs, bytes sent on)] per pipeline layer (spec.pipeline_layers) lowered on one
    micro-batch of `rows` (`simulate --mesh stage=K`'s pipeline step; nothing runs): a workload
    that pipelines supplies it."""
    raise ValueError(f"{self.spec.name} has no per-layer profile for simulate's pipeline step")

  def load_weights(self, state, shardings):
    """The state with weights the config names loaded over the initialised ones (a reference
    checkpoint), placed per `shardings`; not called when describing. Default: none."""
    del shardings
    return state

  @abc.abstractmethod
  def eval_step(self, state, batch):
    """Device: the outputs of one eval batch ([correct, counted] for a CountEvaluator)."""

  # Whether the workload's pipeline reads its parameters through self.stage_weights (then,
  # with --mesh stage=K, each stage's own parameters and optimizer state live on its devices
  # only: jax_stage_weights.py); its pipelined loss and eval step read them with params_of.
  owns_stage_weights = False

  def stage_update(self, tx):
    """(per-stage transformation, step on the whole stored gradient before it or None) of
    the optimizer `tx` under stage-owned weights (jax_stage_weights.StageWeights.optimizer);
    a workload whose update reads every stage's gradient returns that part as the step before
    (the same objects at every call: the state's `tx` is a static field)."""
    return tx, None

  # ------------------------------------------------------------------ shared
  def __init__(self, cfg, ctx):
    runtime = jax_runtime.MeshRuntime(cfg.parallel, cfg.train.global_batch_size,
                                      describing=ctx.describing)
    gbs = cfg.train.global_batch_size
    if gbs % runtime.shape.batch_shards:
      raise ValueError(f"train.global_batch_size={gbs} is not divisible by the "
                       f"{runtime.shape.batch_shards} devices the batch is split over "
                       "(data x expert)")
    self._build_common(cfg, ctx, runtime, runtime.stage > 1 or runtime.microbatches > 1)
    self.device_kind = jax.devices()[0].device_kind
    self.dtype = jnp.bfloat16 if cfg.train.precision == "bfloat16" else jnp.float32
    self.stage_weights = None     # jax_stage_weights.StageWeights, made by init() when owned
    self.describing = False       # describe() before init: shapes and the train step only

  def eval_batch_size(self):
    """cfg.data.eval_batch_size rounded up to a multiple of the batch's shards (data x expert)
    and the hosts."""
    unit = math.lcm(self.runtime.shape.batch_shards, self.runtime.process_count)
    return math.ceil(self.cfg.data.eval_batch_size / unit) * unit

  def batch_layout(self, batch_size, with_mask=False):
    return self.spec.batch_layout(self.cfg, batch_size, with_mask)

  def batch_axes(self, with_mask=False):
    return {k: axes for k, (_, _, axes) in self.batch_layout(1, with_mask).items()}

  def batch_shapes(self, batch_size, with_mask=False):
    return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=self.runtime.sharding(axes))
            for k, (shape, dtype, axes) in self.batch_layout(batch_size, with_mask).items()}

  def initial_state(self, shardings, *args):
    """self.stored_state(*args) (create_state's state, stage-owned weights in their stored form),
    placed on the mesh. Compiled at XLA's backend optimisation level 0: it runs once, and at the
    default level its compile (every initialiser's threefry bits and normal transforms) took
    longer than the train step's (EfficientNet tiny 16.8 s against 6.3 s at level 0, ResNet tiny
    6.5 s against 1.4 s, 2 CPU cores). The values equal
    the default level's to 1 ulp (FMA contraction differs) and are the same run to run.
    When describing: the state's shapes only (nothing initialised)."""
    if self.describing:
      return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          jax.eval_shape(self.stored_state, *args), shardings)
    create = jax.jit(self.stored_state, out_shardings=shardings)
    return create.lower(*args).compile(compiler_options=LEVEL_0)(*args)

  def init(self):
    """Initialises the state on the mesh (create_state, then load_weights) and compiles both
    steps, before run_start."""
    rng = jax.random.key(self.ctx.seed)
    self.stage_weights = None
    # Beside a model axis the stages' rows would have to be split per tensor on it, and under
    # weight-update sharding over data (a row split on data reaches each stage's branch of the
    # per-stage update in pieces, whose collectives differ by stage: the devices deadlock).
    # There the weights stay whole over stage, split on model or their update on data.
    rt = self.runtime
    if (self.owns_stage_weights and rt.stage > 1 and rt.model == 1
        and not rt.weight_update_sharding):
      self.stage_weights = jax_stage_weights.StageWeights(
          jax.eval_shape(self.create_state, rng).params, self.spec.pipeline_layers(self.cfg),
          self.stage_cut)
    shardings = self.state_shardings(self.stored_state, rng)
    self.state = self.initial_state(shardings, rng)
    if not self.describing:
      self.state = self.load_weights(self.state, shardings)
      self._stop_point(self.state)      # a long init: a signal need not wait for the compile
    self.compile_steps(self.train_step_fn(), shardings)

  def stored_state(self, rng):
    """create_state's state as it is kept: with stage-owned weights, the parameters in their
    stored form and the optimizer run per stage on them (jax_stage_weights.py)."""
    state = self.create_state(rng)
    if getattr(self, "stage_weights", None) is None:
      return state
    stored = self.stage_weights.store(state.params)
    per_stage, before = self.stage_update(state.tx)
    tx = self.stage_weights.optimizer(per_stage, self.runtime.mesh, before)
    return state.replace(params=stored, tx=tx, opt_state=tx.init(stored))

  def _eval_on_whole_params(self, state, batch):
    """The eval step on the whole parameter tree: with stage-owned weights each eval batch's
    program gathers the stages' rows first (the beam search does not decode through the
    stages: that would send its cache over the pipeline at every decode step)."""
    if getattr(self, "stage_weights", None) is not None:
      state = state.replace(params=self.params_of(state))
    return self.eval_step(state, batch)

  def params_of(self, state_or_params):
    """The whole parameter tree of a state (or of its `params`, or of a gradient of them):
    with stage-owned weights the stages' rows unpacked (on a mesh: gathered over `stage`)."""
    params = getattr(state_or_params, "params", state_or_params)
    weights = getattr(self, "stage_weights", None)
    return params if weights is None else weights.full(params)

  def state_shardings(self, create_state, rng):
    """Shardings of the state `create_state(rng)` builds, per the runtime's layout rules."""
    if getattr(self, "stage_weights", None) is not None:
      self.runtime.param_layouts_extra = {jax_stage_weights.ROWS: ("stage", None)}
    return self.runtime.state_shardings(jax.eval_shape(create_state, rng),
                                        self.spec.param_axes)

  def pipelined(self, loss_and_grads, remat=None):
    """A workload's GPipe `loss_and_grads(model, runtime, cut, ..., remat=)` with the model,
    runtime and stage cut bound (None without a pipeline); `remat` overrides parallel.remat
    (describe compiles both)."""
    if not self.stage_cut:
      return None
    remat = self.cfg.parallel.remat if remat is None else remat
    owned = {"weights": self.stage_weights} if self.owns_stage_weights else {}
    return functools.partial(loss_and_grads, self.model, self.runtime, self.stage_cut,
                             remat=remat, **owned)

  def compile_steps(self, train_step, state_shardings):
    """AOT-compiles the train step (state donated) and, where there is an eval split, the eval
    step for self.state. When describing, the train step is only read (cost analysis, HLO),
    never run: compiled at backend optimisation level 0, which leaves the HLO and its cost
    analysis as they are and skips LLVM's work (ResNet-50 reference describe at 128 px: 28 ->
    22 s, the same FLOPs)."""
    if self.runtime.abstract:           # a layout larger than this machine: shapes only
      return
    options = LEVEL_0 if self.describing else None
    with self.runtime.tracing():        # activations' logical names resolve on this mesh
      lowered = jax.jit(train_step, donate_argnums=0, out_shardings=(
          state_shardings, self.runtime.replicated)).lower(
              self.state, self.batch_shapes(self.cfg.train.global_batch_size))
    self._train_lowered, self._train_fn = lowered, train_step
    self._train_step = lowered.compile(compiler_options=options)
    # describe reads the train step's program only; a synthetic run has no eval split
    # (evaluate() refuses it), so its eval step would be compiled and never run
    if self.describing or is_synthetic(self.cfg):
      return
    with self.runtime.tracing():
      lowered = jax.jit(self._eval_on_whole_params).lower(
          self.state, self.batch_shapes(self.eval_batch_size(), with_mask=True))
    self._eval_step = lowered.compile()

  def _device_batches(self, dataset, axes, counted=False):
    """Puts host batches on the mesh two steps ahead, so the copy overlaps compute; `counted`:
    (batch, the samples it trains, counted on the host) pairs."""
    queue = collections.deque()
    for batch in dataset:
      placed = self.runtime.shard_batch(batch, axes)
      queue.append((placed, self.samples_in(batch)) if counted else placed)
      if len(queue) == 2:
        yield queue.popleft()
    yield from queue

  def samples_in(self, host_batch):
    """The samples a host batch trains: the global batch (packed rows count their own)."""
    del host_batch
    return self.cfg.train.global_batch_size

  def synthetic_batch(self, with_samples=False):
    """One global batch of the real shapes on the mesh (reused every step); `with_samples`:
    (it, the samples it trains)."""
    shapes = self.batch_shapes(self.cfg.train.global_batch_size)
    batch = self.pipeline.synthetic_batch(self.cfg, self.cfg.train.global_batch_size,
                                          self.ctx.seed + 1)
    placed = {k: jax.device_put(v.astype(shapes[k].dtype), shapes[k].sharding)
              for k, v in batch.items()}
    return (placed, self.samples_in(batch)) if with_samples else placed

  def _train_batches(self):
    """(device batch, samples) pairs."""
    if self._train_iter is None:        # first use is after run_start: no data read before
      if is_synthetic(self.cfg):
        batch = self.synthetic_batch(with_samples=True)
        self._train_iter = iter(lambda: batch, None)
      else:
        rt = self.runtime
        ds = self.pipeline.train_dataset(self.cfg, self.cfg.train.global_batch_size,
                                         self.ctx.seed, self.data_dir, rt.process_index,
                                         rt.process_count)
        self._train_iter = self._device_batches(ds.as_numpy_iterator(), self.batch_axes(),
                                                counted=True)
    return self._train_iter

  def train(self, num_steps=None, *, samples=None):
    """A block of `num_steps` steps, or of as many as train at least `samples` samples (the
    batches' own counts, read on the host: no sync), at most `num_steps` where both are given.
    A step returns its loss, or {'loss', 'router'} with an MoE model's router figures
    (reported per block: moe.report). The metrics carry the block's 'samples'."""
    batches = self._train_batches()
    outputs, trained = [], 0
    while ((samples is None or trained < samples)
           and (num_steps is None or len(outputs) < num_steps)):
      self._stop_point(self.state)
      batch, count = next(batches)
      self.state, out = self._train_step(self.state, batch)
      outputs.append(out)
      trained += count
    step = int(self.state.step)                         # the one host sync of the block
    # the block's losses fetched together and averaged on the host: a jnp.stack of a new
    # block length would compile a new program here, which a synthetic run's timed block
    # paid for (ResNet tiny, 10 steps: 6 ms a step against 1.1 ms over 100 steps)
    losses = jax.device_get([out["loss"] if isinstance(out, dict) else out for out in outputs])
    metrics = {"loss": float(np.mean(np.asarray(losses, np.float64))),
               "lr": float(self.schedule(step - 1)), "step": step, "samples": trained}
    if isinstance(outputs[0], dict) and "router" in outputs[0]:
      router = moe.block_metrics([jax.tree.map(np.asarray, out["router"]) for out in outputs])
      metrics["progress"], metrics["scalars"] = moe.report(router)
    return metrics

  def _stop_point(self, dispatched):
    """Where a signal stops the run (Trainer.stop_check): between two steps or eval batches,
    in this loop's own code. The steps already dispatched finish first (`dispatched`: what the
    last of them returns), so the process never leaves while XLA still runs them."""
    try:
      self.stop_check()
    except BaseException:
      jax.block_until_ready(dispatched)
      raise

  def _to_host(self, outputs):
    """Device outputs of one eval batch -> numpy with the whole global batch on this host."""
    if self.runtime.process_count > 1:
      return multihost_utils.process_allgather(outputs, tiled=True)
    return jax.tree.map(np.asarray, outputs)

  def evaluate(self):
    if is_synthetic(self.cfg):
      raise ValueError("a synthetic run has no eval split")
    rt = self.runtime
    if self._eval_data is None:         # built once: its .cache() then serves every eval
      self._eval_data = self.pipeline.eval_dataset(self.cfg, self.eval_batch_size(),
                                                   self.data_dir, rt.process_index,
                                                   rt.process_count)
    acc = None
    for batch in self._device_batches(self._eval_data.as_numpy_iterator(), self.batch_axes(True)):
      self._stop_point(acc)
      outputs = self._eval_step(self.state, batch)
      acc = self.accumulate(acc, self._to_host(outputs) if self.eval_on_host else outputs)
    return self.finalize(acc)

  def parameter_sizes(self):
    """{parameter path: element count}, from shapes (nothing initialised)."""
    params = jax.eval_shape(self.create_state, jax.random.key(0)).params   # the whole tree
    return {jax_runtime.path_name(path): math.prod(leaf.shape)
            for path, leaf in jax.tree_util.tree_leaves_with_path(params)}

  def parameter_count(self):
    """Trainable parameters, from the state's shapes (nothing initialised or compiled): what
    the gradient all-reduce moves (`simulate --workload`)."""
    return int(sum(self.parameter_sizes().values()))

  def _describe_pipeline(self):
    """GPipe's figures: the stage cut (layers and the parameters each stage computes with),
    the schedule's iterations and bubble, the compiled step's temporaries with and without
    re-materialization (the other one compiled here), and the bytes the stage shifts move per
    step per device (the permutes' result bytes in the compiled step, each run once per
    iteration of its loop: forward and backward)."""
    rt, spec = self.runtime, self.spec
    sizes = self.parameter_sizes()
    remat = self.cfg.parallel.remat
    temp = {remat: self._train_step.memory_analysis().temp_size_in_bytes}
    with rt.tracing():
      other = jax.jit(self.train_step_fn(remat=not remat), donate_argnums=0).lower(
          self.state, self.batch_shapes(self.cfg.train.global_batch_size)).compile(
              compiler_options=LEVEL_0)
    temp[not remat] = other.memory_analysis().temp_size_in_bytes
    iterations = gpipe.iterations(rt.stage, rt.microbatches)
    permutes = rt.collectives_by_axis(self._train_step.as_text()).get(
        ("collective-permute", "stage"), [0, 0, 0])
    return PipelineDescription(
        stages=rt.stage, microbatches=rt.microbatches, iterations=iterations,
        bubble_fraction=gpipe.bubble_fraction(rt.stage, rt.microbatches),
        cut=gpipe.stage_summary(spec.pipeline_layers(self.cfg), self.stage_cut, sizes),
        remat=remat, activation_bytes_remat=int(temp[True]),
        activation_bytes_no_remat=int(temp[False]),
        activation_source="the compiled step's temporaries",
        permute_bytes_per_step=int(permutes[2]) * iterations,
        shift_source="collective permutes, one an iteration, bubbles included")

  def _train_step_flops(self):
    """FLOPs of the whole train step (every device's). On a CPU, or across devices, from XLA's
    cost analysis of the compiled program (one device's share, x devices). Off a CPU on one
    device the program's own count before the backend rewrites it (jax_flops.step_flops: a
    GPU's compiled matmuls and convolutions are cuBLAS/cuDNN calls the compiled analysis
    does not count). (Across devices the lowered program mixes global shapes with
    shard_map's per-device ones, so there it is the compiled one's figure, undercounted on a
    GPU.) NaN where nothing answers."""
    if jax.default_backend() != "cpu" and self.num_devices == 1:
      with self.runtime.tracing():
        flops, _ = jax_flops.step_flops(self._train_fn, self._train_lowered, self.state,
                                        self.batch_shapes(self.cfg.train.global_batch_size))
      return float("nan") if flops is None else flops
    try:
      flops = jax_flops.flops_of(self._train_step.cost_analysis())
    except Exception:  # pylint: disable=broad-except  # some PJRT plugins raise
      flops = None
    return float("nan") if flops is None else flops * self.num_devices

  def describe(self, pipeline=True):
    """The compiled step's cost analysis, HLO and memory analysis, and the layout: bytes per
    device of the parameters and optimizer state (read from the state's shards, or from shapes
    on an abstract mesh), which parameters the model axis splits and which stay whole. Before
    init: the train step compiled on the state's shapes (no state initialised, no eval step
    compiled: the ResNet-50 describe went from ~65 s to ~30 s); the trainer is then for
    describing only. On a mesh larger than the machine nothing is compiled: no FLOPs,
    activation bytes or collectives."""
    rt = self.runtime
    if not hasattr(self, "_train_step") and not (rt.abstract and hasattr(self, "state")):
      self.describing = True
      self.init()
    weights = getattr(self, "stage_weights", None)
    info = Description(
        parameters=(weights.count if weights else
                    sum(math.prod(x.shape) for x in jax.tree.leaves(self.state.params))),
        parameter_bytes_per_device=jax_runtime.per_device_bytes(self.state.params),
        optimizer_state_bytes_per_device=jax_runtime.per_device_bytes(self.state.opt_state),
        layout=rt.layout_summary(self.spec.param_axes))
    if weights:                  # what each device held before stages owned their weights
      info.parameter_bytes_without_stages = weights.count * weights.dtype.itemsize
    if rt.abstract:
      info.flops_missing = "not compiled (the mesh has more devices than this machine)"
      return info
    if self.stage_cut and pipeline:
      info.pipeline = self._describe_pipeline()
    info.train_flops_per_example = (self._train_step_flops()
                                    / self.cfg.train.global_batch_size)
    hlo = self._train_step.as_text()
    memory = self._train_step.memory_analysis()
    info.activation_bytes_per_device = int(memory.temp_size_in_bytes) if memory else None
    info.collectives_in_train_step = jax_runtime.count_collectives(hlo)
    info.collectives_by_axis = rt.collectives_by_axis(hlo)
    return info
