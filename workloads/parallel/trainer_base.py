"""What the two framework bases (jax_trainer_base.MeshTrainer, tf_trainer_base.StrategyTrainer)
share, framework-neutral: the run's config and context, the mesh axes and GPipe stage cut the
workload allows, its input pipeline, data source and evaluator, and the eval's host phases.
A workload's trainer derives from one of the two bases, never from this one directly.
"""
from harness import mesh, pipeline as gpipe
from harness.workload import Trainer


class WorkloadTrainer(Trainer):
  spec = None                   # the workload's WorkloadSpec (harness/workload.py): its batch
                                # layout, parameter axes, mesh axes, input pipeline and the
                                # eval's host side
  # The learning-rate schedule, step -> rate (the train loop reports the block's last rate):
  # every workload's __init__ sets it before building its optimizer from it.
  built_with = ("schedule",)
  schedule: object

  def _build_common(self, cfg, ctx, runtime, pipelined: bool):
    """The framework-neutral part of a base's __init__, once its runtime exists."""
    self.cfg, self.ctx, self.runtime = cfg, ctx, runtime
    spec = self.spec
    mesh.check_workload_axes(runtime.shape, spec.name, spec.mesh_axes)
    # GPipe (stage axis or micro-batches): layers per stage, None without a pipeline
    self.stage_cut = None
    if pipelined:
      if spec.pipeline_layers is None:
        raise ValueError(f"{spec.name} has no pipeline layers; allowed: --mesh stage=1 and "
                         "parallel.microbatches=1")
      self.stage_cut = gpipe.stage_cut(spec.pipeline_layers(cfg), runtime.stage,
                                       cfg.parallel.stage_layers)
    self.num_devices, self.data_replicas = runtime.num_devices, runtime.data
    self.mesh_description = runtime.description
    self.pipeline = spec.input_pipeline           # harness.workload.InputPipeline
    self.data_dir, self.train_examples = self.pipeline.data_source(cfg, ctx)
    self.evaluator = spec.evaluator(cfg, self.data_dir)   # harness.workload.Evaluator
    self.eval_examples = cfg.data.eval_examples
    self._train_iter = self._eval_data = None

  @property
  def eval_on_host(self):
    """Whether eval outputs come to the host every batch (the evaluator's)."""
    return self.evaluator.on_host

  def accumulate(self, acc, outputs):
    """Adds one batch's outputs (spec.evaluator: device arrays summed per replica, or host
    numpy when on_host)."""
    return self.evaluator.accumulate(acc, outputs)

  def finalize(self, acc):
    return self.evaluator.finalize(acc)

  @property
  def process_hosts(self):
    """Every process's host by index (multi-process runs), for the line naming a lost peer."""
    return self.runtime.process_hosts

