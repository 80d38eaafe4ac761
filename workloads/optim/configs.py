"""Optimizer configs shared by workloads (TF Model Garden's optimizer registry, minus the
indirection): each is a dataclass with the MLPerf reference's names and defaults, validated
with the harness's public validators, read by jax_optimizers.py and tf_optimizers.py alike."""
import dataclasses
from typing import ClassVar

from harness.config import in_range, key_of, one_of, positive
from harness.errors import UsageError


@dataclasses.dataclass
class LarsSgdConfig:
  """LARS / SGD+momentum with linear warmup then polynomial decay (MLPerf ResNet)."""
  name: str = "lars"                  # lars | sgd
  base_learning_rate: float = 10.0
  warmup_epochs: float = 5.0
  end_learning_rate: float = 1e-4
  decay_poly_power: float = 2.0
  weight_decay: float = 2e-4
  momentum: float = 0.9
  lars_eta: float = 0.001             # trust coefficient
  lars_epsilon: float = 0.0
  label_smoothing: float = 0.1

  def summary(self) -> str:
    return (f"{self.name} (base lr {self.base_learning_rate}, warmup {self.warmup_epochs} "
            f"epochs, weight decay {self.weight_decay}, momentum {self.momentum})")

  def validate(self):
    one_of(self, "name", ("lars", "sgd"))
    positive(self, "base_learning_rate")
    for field in ("warmup_epochs", "end_learning_rate", "weight_decay", "lars_epsilon"):
      in_range(self, field, 0.0, None)
    in_range(self, "momentum", 0.0, 1.0)
    in_range(self, "label_smoothing", 0.0, 1.0)
    positive(self, "lars_eta", "decay_poly_power")


@dataclasses.dataclass
class SgdStepConfig:
  """SGD with momentum, linear warmup and x0.1 steps at epochs (MLPerf SSD, ssd-v1 train.py):
  the rate is base_learning_rate_per_32 x global batch / 32; torch's SGD (v = m v + g + wd w,
  w -= lr v) with weight decay on every parameter."""
  name: str = "sgd"
  base_learning_rate_per_32: float = 2.5e-3
  warmup_steps: int = 0
  warmup_factor: int = 0              # warmup starts at lr x (1 - 1 / 2**factor)
  decay_boundary_epochs: tuple[float, ...] = (40.0, 50.0)
  decay_factor: float = 0.1
  weight_decay: float = 5e-4
  momentum: float = 0.9

  def summary(self) -> str:
    return (f"sgd (lr {self.base_learning_rate_per_32} x batch/32, warmup {self.warmup_steps} "
            f"steps, x{self.decay_factor} at epochs {list(self.decay_boundary_epochs)}, weight "
            f"decay {self.weight_decay}, momentum {self.momentum})")

  def validate(self):
    one_of(self, "name", ("sgd",))
    positive(self, "base_learning_rate_per_32", "decay_factor")
    in_range(self, "warmup_steps", 0, None)
    in_range(self, "warmup_factor", 0, None)
    in_range(self, "weight_decay", 0.0, None)
    in_range(self, "momentum", 0.0, 1.0)
    b = self.decay_boundary_epochs
    if list(b) != sorted(b) or (b and min(b) <= 0):
      raise UsageError(f"{key_of(self, 'decay_boundary_epochs')}={b!r} is not allowed; "
                       "allowed: increasing epochs > 0, e.g. 40,50")


@dataclasses.dataclass
class LambConfig:
  """LAMB and its schedule as the MLPerf BERT reference flags name them (run_pretraining.py)."""
  name: str = "lamb"
  base_learning_rate: float = 0.00035        # --learning_rate
  beta_1: float = 0.9                        # --lamb_beta_1
  beta_2: float = 0.999                      # --lamb_beta_2
  epsilon: float = 1e-6                      # 10 ** --log_epsilon
  weight_decay_rate: float = 0.01            # --lamb_weight_decay_rate
  training_steps: int = 0                    # --num_train_steps: lr decays to 0 here; 0: derived
                                             # from the sample budget (spec.derive)
  warmup_steps: int = 0                      # --num_warmup_steps
  start_warmup_step: int = 0                 # --start_warmup_step
  decay_poly_power: float = 1.0              # --poly_power
  clip_norm: float = 1.0                     # tf.clip_by_global_norm before the update

  def validate(self):
    one_of(self, "name", ("lamb",))
    positive(self, "base_learning_rate", "epsilon", "decay_poly_power")
    in_range(self, "training_steps", 0, None)
    in_range(self, "beta_1", 0.0, 1.0)
    in_range(self, "beta_2", 0.0, 1.0)
    in_range(self, "weight_decay_rate", 0.0, None)
    in_range(self, "warmup_steps", 0, None)
    in_range(self, "clip_norm", 0.0, None)

  def summary(self) -> str:
    return (f"lamb (base lr {self.base_learning_rate}, warmup {self.warmup_steps} steps from "
            f"step {self.start_warmup_step}, linear decay to 0 at step {self.training_steps}, "
            f"betas {self.beta_1}/{self.beta_2}, eps {self.epsilon}, weight decay "
            f"{self.weight_decay_rate}, clip norm {self.clip_norm})")


@dataclasses.dataclass
class RmsPropConfig:
  """RMSProp with TF semantics and the tensorflow/tpu EfficientNet schedule and EMA
  (models/official/efficientnet main.py / utils.py defaults)."""
  # TF has no flat rule for RMSProp's weight-update sharding (tf_optimizers.TfRmsProp lacks
  # flat_update_rule): the command line refuses the flag before a run starts
  tf_weight_update_sharding: ClassVar[bool] = False
  name: str = "rmsprop"
  base_learning_rate_per_256: float = 0.016  # lr = this x global batch / 256
  warmup_epochs: float = 5.0                 # linear from 0
  decay_epochs: float = 2.4                  # then x decay_factor every decay_epochs (staircase,
  decay_factor: float = 0.97                 # counted from step 0)
  decay: float = 0.9                         # rho of the mean square
  momentum: float = 0.9
  epsilon: float = 1e-3                      # inside the sqrt (TF's ApplyRMSProp)
  weight_decay: float = 1e-5                 # L2 (wd/2 * ||w||^2 in the loss), not on batch norm
  label_smoothing: float = 0.1
  ema_decay: float = 0.9999                  # of weights and BN statistics; eval uses the EMA

  def summary(self) -> str:
    return (f"rmsprop (lr {self.base_learning_rate_per_256} x batch/256, warmup "
            f"{self.warmup_epochs} epochs, x{self.decay_factor} every {self.decay_epochs} epochs, "
            f"rho {self.decay}, momentum {self.momentum}, eps {self.epsilon}, weight decay "
            f"{self.weight_decay}, EMA {self.ema_decay})")

  def validate(self):
    one_of(self, "name", ("rmsprop",))
    positive(self, "base_learning_rate_per_256", "decay_epochs", "epsilon")
    in_range(self, "warmup_epochs", 0.0, None)
    in_range(self, "weight_decay", 0.0, None)
    for field in ("decay_factor", "decay", "momentum", "label_smoothing", "ema_decay"):
      in_range(self, field, 0.0, 1.0)


@dataclasses.dataclass
class LarsPolyConfig:
  """LARS with linear warmup then polynomial decay, as tensorflow/tpu EfficientNet runs it for
  "Training EfficientNets at Supercomputer Scale" (arXiv 2011.00071): main.py --optimizer=lars
  --lr_schedule=poly, utils.build_learning_rate / build_optimizer, lars_optimizer.py. The LARS
  update is MLPerf's (jax_optimizers.mlperf_lars: trust ratio and LARS weight decay on kernels
  only, as the reference's skip list 'batch_normalization', 'bias', 'beta', 'gamma'); the
  reference also keeps its L2 term in the loss (`weight_decay`, every variable but batch norm's),
  so the gradient LARS sees already holds wd * w."""
  name: str = "lars"
  base_learning_rate_per_256: float = 0.016  # lr = this x global batch / 256 (main.py)
  warmup_epochs: float = 5.0                 # linear from 0 (main.py lr_warmup_epochs)
  end_learning_rate: float = 0.1             # absolute, not scaled (utils.py, fixed there)
  decay_poly_power: float = 2.0              # (utils.py, fixed there)
  lars_weight_decay: float = 1e-5            # inside LARS (main.py lars_weight_decay)
  weight_decay: float = 1e-5                 # the loss's L2 term (main.py weight_decay)
  momentum: float = 0.9                      # (utils.build_optimizer)
  lars_eta: float = 0.001                    # trust coefficient (lars_optimizer.py eeta)
  lars_epsilon: float = 0.0                  # (main.py lars_epsilon)
  label_smoothing: float = 0.1
  ema_decay: float = 0.9999                  # moving average for eval, as with RMSProp

  def summary(self) -> str:
    return (f"lars (lr {self.base_learning_rate_per_256} x batch/256, warmup "
            f"{self.warmup_epochs} epochs, poly power {self.decay_poly_power} to "
            f"{self.end_learning_rate}, LARS wd {self.lars_weight_decay}, L2 {self.weight_decay}, "
            f"momentum {self.momentum}, eta {self.lars_eta}, EMA {self.ema_decay})")

  def validate(self):
    one_of(self, "name", ("lars",))
    positive(self, "base_learning_rate_per_256", "decay_poly_power", "lars_eta")
    for field in ("warmup_epochs", "end_learning_rate", "lars_weight_decay", "weight_decay",
                  "lars_epsilon"):
      in_range(self, field, 0.0, None)
    for field in ("momentum", "label_smoothing", "ema_decay"):
      in_range(self, field, 0.0, 1.0)


@dataclasses.dataclass
class AdamConfig:
  """Adam and the rsqrt schedule of the MLPerf Transformer reference (retired `transformer`,
  model_params.py / transformer_main.py): lr = base x hidden^-0.5 x min(1, step / warmup) x
  rsqrt(max(step, warmup)). Epsilon is fixed by the rules (closed_transformer.yaml: 1e-9); the
  update is TF's (epsilon added to sqrt(v) before the bias correction, as the reference's
  LazyAdamOptimizer and Keras' Adam compute it)."""
  name: str = "adam"
  base_learning_rate: float = 2.0            # learning_rate
  warmup_steps: int = 16_000                 # learning_rate_warmup_steps
  beta_1: float = 0.9                        # optimizer_adam_beta1
  beta_2: float = 0.997                      # optimizer_adam_beta2
  epsilon: float = 1e-9                      # optimizer_adam_epsilon
  label_smoothing: float = 0.1

  def summary(self) -> str:
    return (f"adam (base lr {self.base_learning_rate} x hidden^-0.5, rsqrt decay after "
            f"{self.warmup_steps} warmup steps, betas {self.beta_1}/{self.beta_2}, eps "
            f"{self.epsilon}, label smoothing {self.label_smoothing})")

  def validate(self):
    one_of(self, "name", ("adam",))
    positive(self, "base_learning_rate", "epsilon")
    in_range(self, "warmup_steps", 0, None)
    for field in ("beta_1", "beta_2", "label_smoothing"):
      in_range(self, field, 0.0, 1.0)


@dataclasses.dataclass
class AdagradConfig:
  """Adagrad as torch.optim.Adagrad computes it (the MLPerf DLRM-DCNv2 reference's optimizer,
  dense layers and embedding tables alike), with the reference's LRPolicyScheduler: linear
  warmup, then from decay_start a quadratic decay over decay_steps. The closed rules fix
  everything but the learning rate (closed_dlrm_dcnv2.yaml: lr decay, weight decay, initial
  accumulator, warmup and decay steps 0, epsilon 1e-8)."""
  name: str = "adagrad"
  base_learning_rate: float = 0.004          # opt_base_learning_rate
  epsilon: float = 1e-8                      # opt_adagrad_epsilon (outside the sqrt, as torch)
  initial_accumulator_value: float = 0.0     # opt_adagrad_initial_accumulator_value
  lr_decay: float = 0.0                      # opt_adagrad_learning_rate_decay
  weight_decay: float = 0.0                  # opt_weight_decay
  warmup_steps: int = 0                      # opt_learning_rate_warmup_steps
  decay_start_step: int = 0                  # opt_learning_rate_decay_start_step
  decay_steps: int = 0                       # opt_learning_rate_decay_steps

  def summary(self) -> str:
    return (f"adagrad (lr {self.base_learning_rate}, eps {self.epsilon}, warmup "
            f"{self.warmup_steps} steps, decay {self.decay_steps} steps from step "
            f"{self.decay_start_step})")

  def validate(self):
    one_of(self, "name", ("adagrad",))
    positive(self, "base_learning_rate", "epsilon")
    for field in ("initial_accumulator_value", "warmup_steps", "decay_start_step", "decay_steps"):
      in_range(self, field, 0, None)
    for field in ("lr_decay", "weight_decay"):
      if getattr(self, field):
        raise UsageError(f"{key_of(self, field)}={getattr(self, field)!r} is not implemented "
                         "(the MLPerf rules fix it to 0); allowed: 0")


@dataclasses.dataclass
class AdamWConfig:
  """AdamW and its schedule as the MLPerf Llama 3.1 reference runs them (NeMo's
  distributed_fused_adam_with_cosine_annealing: Megatron's fused Adam in AdamW mode, NeMo's
  CosineAnnealing scheduler), with the values closed_llama31_8b.yaml (ruleset 5.1.0) fixes:
  betas 0.9/0.95, epsilon 1e-5, weight decay 0.1, gradient clip 1.0, max_steps 1,200,000 (the
  cosine's length: over a benchmark's ~10k steps the rate barely decays). Warmup is given in
  samples, as the RCPs state it (opt_learning_rate_warmup_samples), and becomes whole steps of
  the run's batch."""
  name: str = "adamw"
  base_learning_rate: float = 4e-4           # opt_base_learning_rate (RCP at batch 16)
  end_learning_rate_ratio: float = 0.1       # min_lr = 0.1 x max_lr (pretrain_llama31.py)
  warmup_samples: int = 256                  # opt_learning_rate_warmup_samples (RCP at 16)
  max_steps: int = 1_200_000                 # closed rules: max_steps == 1,200,000
  beta_1: float = 0.9                        # opt_adamw_beta_1
  beta_2: float = 0.95                       # opt_adamw_beta_2
  epsilon: float = 1e-5                      # opt_adamw_epsilon
  weight_decay: float = 0.1                  # opt_adamw_weight_decay (matrices, not norms)
  clip_norm: float = 1.0                     # opt_gradient_clip_norm

  def warmup_steps(self, global_batch_size: int) -> int:
    return -(-self.warmup_samples // global_batch_size)

  def validate(self):
    one_of(self, "name", ("adamw",))
    positive(self, "epsilon", "max_steps")
    in_range(self, "base_learning_rate", 0.0, None)   # 0: the RCP's at the batch (derive)
    in_range(self, "end_learning_rate_ratio", 0.0, 1.0)
    in_range(self, "warmup_samples", 0, None)
    in_range(self, "beta_1", 0.0, 1.0)
    in_range(self, "beta_2", 0.0, 1.0)
    in_range(self, "weight_decay", 0.0, None)
    in_range(self, "clip_norm", 0.0, None)

  def summary(self) -> str:
    return (f"adamw (lr {self.base_learning_rate}, linear warmup {self.warmup_samples} samples, "
            f"cosine to {self.end_learning_rate_ratio} x lr at step {self.max_steps}, betas "
            f"{self.beta_1}/{self.beta_2}, eps {self.epsilon}, weight decay {self.weight_decay}, "
            f"clip norm {self.clip_norm})")
