"""Optimizers for the TF side, as Keras 3 optimizers, with the same update rules as
jax_optimizers.py (see its docstring for the MLPerf LARS formula):

  LARS, kernels:     v = m*v + lr * trust * (g + wd*w),  trust = eta*||w|| / (||g|| + wd*||w|| + eps)
  LARS, bias/BN:     v = m*v + lr * g
  SGD (TF v1 style): v = m*v + g (+ wd*w on kernels);  w = w - lr*v
  w = w - v          (LARS)

Which variables are kernels comes from `tf_model.decayed_variables` (layer roles) through Keras'
`exclude_from_weight_decay(var_list=...)`. Keras' built-in SGD puts lr inside the momentum
(v = m*v - lr*g), which differs from the MLPerf reference's MomentumOptimizer once lr changes,
so SGD is implemented here too; MLPerfLamb is the BERT reference's LAMB.

Each update formula is one function (`momentum_update`, `lamb_update`) that the per-variable
Keras `update_step` and the flat weight-update-sharding rule (`flat_update_rule`, used by
tf_runtime.ShardedUpdate on slices of many variables) both call.
"""
import keras
from keras import ops


class KerasSchedule(keras.optimizers.schedules.LearningRateSchedule):
  """Any schedules.* formula (callable with `ops=`) as a Keras schedule (the formula lives
  once, in schedules.py), computed in `dtype` (float64 for float64 variables)."""

  def __init__(self, schedule, dtype="float32"):
    self.schedule, self.dtype = schedule, dtype

  def __call__(self, step):
    import tensorflow as tf
    return tf.cast(self.schedule(tf.cast(step, self.dtype), ops=tf.experimental.numpy),
                   self.dtype)

  def get_config(self):
    return vars(self.schedule)


class _Optimizer(keras.optimizers.Optimizer):
  """Our optimizers take gradients the trainer has already summed over replicas.

  Keras sums gradients over replicas itself only *after* clipping them (Optimizer.apply clips,
  then the TF backend all-reduces), so a global-norm clip (LAMB's) would see one replica's
  partial gradients. The TF trainers all-reduce first (tf_runtime.StrategyRuntime.all_sum);
  this turns Keras' second reduction off.
  """

  def _all_reduce_sum_gradients(self, grads_and_vars):
    return grads_and_vars

  @property
  def learning_rate_schedule(self):
    return self._learning_rate

  def flat_update_rule(self):
    """(rule, slot names) for weight-update sharding (tf_runtime.ShardedUpdate): rule(w, g,
    slots, lr, step, mask, layer_norm) -> (new w, new slots) on flat slices of many variables,
    `mask` 1.0 where an element is decayed, `layer_norm(x)` each element's whole-layer norm."""
    raise NotImplementedError


class _TwoMoments(_Optimizer):
  """Adam's two slots per variable, `m` and `v` (LAMB's and Adam's), and the step that reads
  and writes them; a subclass's `moment_update(variable, gradient, m, v, learning_rate, step)`
  -> (new variable, new m, new v) is its formula (`step`: updates including this one)."""
  SLOTS = ("m", "v")          # a variable's slots, each of its shape (describe from shapes)

  def build(self, var_list):
    if self.built:
      return
    super().build(var_list)
    self.moments = [self.add_variable_from_reference(v, "m") for v in var_list]
    self.velocities = [self.add_variable_from_reference(v, "v") for v in var_list]

  def update_step(self, gradient, variable, learning_rate):
    index = self._get_variable_index(variable)
    m, v = self.moments[index], self.velocities[index]
    new_w, new_m, new_v = self.moment_update(
        variable, ops.cast(gradient, variable.dtype), m, v,
        ops.cast(learning_rate, variable.dtype), ops.cast(self.iterations + 1, variable.dtype))
    self.assign(m, new_m)
    self.assign(v, new_v)
    self.assign(variable, new_w)


class MLPerfMomentum(_Optimizer):
  """MLPerf LARS (`lars=True`) or SGD with momentum; weight decay on non-excluded variables."""

  def __init__(self, learning_rate, decay=0.0, momentum=0.9, lars=True, eta=0.001, epsilon=0.0,
               name="mlperf_momentum", **kwargs):
    super().__init__(learning_rate=learning_rate, name=name, **kwargs)
    self.decay, self.momentum, self.lars = decay, momentum, lars
    self.eta, self.epsilon = eta, epsilon

  def build(self, var_list):
    if self.built:
      return
    super().build(var_list)
    self.velocities = [self.add_variable_from_reference(v, "velocity") for v in var_list]

  def update_step(self, gradient, variable, learning_rate):
    v = self.velocities[self._get_variable_index(variable)]
    decayed = self._use_weight_decay(variable)
    norm = lambda x: ops.sqrt(ops.sum(ops.square(x)))
    new_w, new_v = momentum_update(
        variable, ops.cast(gradient, variable.dtype), v, ops.cast(learning_rate, variable.dtype),
        1.0 if decayed else 0.0, norm if decayed and self.lars else None, **self.hyper())
    self.assign(v, new_v)
    self.assign(variable, new_w)

  def hyper(self):
    return dict(decay=self.decay, momentum=self.momentum, lars=self.lars, eta=self.eta,
                epsilon=self.epsilon)

  def flat_update_rule(self):
    hyper = self.hyper()

    def rule(w, g, slots, lr, step, mask, layer_norm):
      del step
      new_w, new_v = momentum_update(w, g, slots["velocity"], lr, mask,
                                     layer_norm if self.lars else None, **hyper)
      return new_w, {"velocity": new_v}
    return rule, ("velocity",)

  def get_config(self):
    config = super().get_config()
    config.update(decay=self.decay, momentum=self.momentum, lars=self.lars, eta=self.eta,
                  epsilon=self.epsilon)
    return config


def momentum_update(w, g, v, lr, decayed, norm, *, decay, momentum, lars, eta, epsilon):
  """One MLPerf LARS or SGD step -> (new w, new velocity). `decayed` is 1.0/0.0 (or a 0/1 mask
  over the elements); `norm(x)` the L2 norm of a whole layer (None: no trust ratio needed)."""
  if lars:
    step = lr * g
    if norm is not None:
      w_norm, g_norm = norm(w), norm(g)
      ratio = eta * w_norm / (g_norm + decay * w_norm + epsilon)
      trust = ops.where(ops.logical_and(w_norm > 0, g_norm > 0), ratio, ops.ones_like(ratio))
      step = decayed * (lr * trust * (g + decay * w)) + (1.0 - decayed) * step
    new_v = momentum * v + step
    return w - new_v, new_v
  new_v = momentum * v + (g + decayed * decay * w)
  return w - lr * new_v, new_v


def make_optimizer(opt_cfg, schedule, decayed_variables, all_variables, dtype="float32",
                   weight_decay=None):
  """`dtype`: the learning rate's (float64 for float64 variables); `weight_decay`: LARS' or
  SGD's decay when it is not `opt_cfg.weight_decay` (configs.LarsPolyConfig's
  lars_weight_decay)."""
  decay = opt_cfg.weight_decay if weight_decay is None else weight_decay
  optimizer = MLPerfMomentum(KerasSchedule(schedule, dtype), decay=decay,
                             momentum=opt_cfg.momentum, lars=opt_cfg.name == "lars",
                             eta=opt_cfg.lars_eta, epsilon=opt_cfg.lars_epsilon)
  decayed = {id(v) for v in decayed_variables}
  optimizer.exclude_from_weight_decay(var_list=[v for v in all_variables if id(v) not in decayed])
  return optimizer


class MLPerfLamb(_TwoMoments):
  """LAMB as the MLPerf BERT reference computes it (formula: jax_optimizers.mlperf_lamb).

  Weight decay and the trust ratio apply to variables not excluded through
  `exclude_from_weight_decay(var_list=...)` (biases and LayerNorm, by layer role, see
  tf_model.lamb_excluded_variables). Gradient clipping by global norm is Keras'
  `global_clipnorm`, which is tf.clip_by_global_norm's formula. The learning rate Keras passes
  in is the schedule at `iterations` (updates already applied), as in the reference.
  """

  def __init__(self, learning_rate, weight_decay_rate=0.01, beta_1=0.9, beta_2=0.999,
               epsilon=1e-6, clip_norm=1.0, name="mlperf_lamb", **kwargs):
    super().__init__(learning_rate=learning_rate, name=name,
                     global_clipnorm=clip_norm or None, **kwargs)
    self.weight_decay_rate, self.beta_1, self.beta_2 = weight_decay_rate, beta_1, beta_2
    self.epsilon, self.clip_norm = epsilon, clip_norm

  def moment_update(self, variable, gradient, m, v, learning_rate, step):
    decayed = self._use_weight_decay(variable)
    norm = lambda x: ops.sqrt(ops.sum(ops.square(x)))
    return lamb_update(variable, gradient, m, v, learning_rate, step, 1.0 if decayed else 0.0,
                       norm if decayed else None, **self.hyper())

  def hyper(self):
    return dict(beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon,
                weight_decay_rate=self.weight_decay_rate)

  def flat_update_rule(self):
    hyper = self.hyper()

    def rule(w, g, slots, lr, step, mask, layer_norm):
      t = ops.cast(step, w.dtype)
      new_w, m, v = lamb_update(w, g, slots["m"], slots["v"], lr, t, mask, layer_norm, **hyper)
      return new_w, {"m": m, "v": v}
    return rule, ("m", "v")

  def get_config(self):
    config = super().get_config()
    config.pop("global_clipnorm", None)              # it is clip_norm here
    config.update(weight_decay_rate=self.weight_decay_rate, beta_1=self.beta_1,
                  beta_2=self.beta_2, epsilon=self.epsilon, clip_norm=self.clip_norm)
    return config


def lamb_update(w, g, m, v, lr, t, decayed, norm, *, beta_1, beta_2, epsilon, weight_decay_rate):
  """One MLPerf LAMB step at update count t (from 1) -> (new w, m, v). `decayed` is 1.0/0.0 or
  a 0/1 mask over elements; `norm(x)` a whole layer's L2 norm (None: no trust ratio)."""
  m = beta_1 * m + (1 - beta_1) * g
  v = beta_2 * v + (1 - beta_2) * ops.square(g)
  # (convert_to_tensor, not cast: a cast sends the Python float through float32 first)
  m_hat = m / (1 - ops.power(ops.convert_to_tensor(beta_1, w.dtype), t))
  v_hat = v / (1 - ops.power(ops.convert_to_tensor(beta_2, w.dtype), t))
  update = m_hat / (ops.sqrt(v_hat) + epsilon)
  if norm is not None:
    update = update + decayed * weight_decay_rate * w
    w_norm, u_norm = norm(w), norm(update)
    ratio = ops.where(ops.logical_and(w_norm > 0, u_norm > 0), w_norm / u_norm,
                      ops.ones_like(w_norm))
    update = (decayed * ratio + (1.0 - decayed)) * update
  return w - lr * update, m, v


def make_lamb(lamb_cfg, schedule, excluded_variables, dtype="float32"):
  """`dtype`: the learning rate's (float64 for float64 variables)."""
  optimizer = MLPerfLamb(KerasSchedule(schedule, dtype), lamb_cfg.weight_decay_rate,
                         lamb_cfg.beta_1, lamb_cfg.beta_2, lamb_cfg.epsilon, lamb_cfg.clip_norm)
  optimizer.exclude_from_weight_decay(var_list=list(excluded_variables))
  return optimizer


class TfRmsProp(_Optimizer):
  """RMSProp as TF1's RMSPropOptimizer computes it (formula: jax_optimizers.tf_rmsprop): mean
  square starting at 1.0, epsilon inside the sqrt, lr inside the momentum, and the L2 term
  wd * w added to the gradient of variables not excluded with `exclude_from_weight_decay`
  (batch norm's). Keras' own RMSprop starts the mean square at 0 and adds epsilon outside."""

  def __init__(self, learning_rate, rho=0.9, momentum=0.9, epsilon=1e-3, decay=0.0,
               name="tf_rmsprop", **kwargs):
    super().__init__(learning_rate=learning_rate, name=name, **kwargs)
    self.rho, self.momentum, self.epsilon, self.decay = rho, momentum, epsilon, decay

  def build(self, var_list):
    if self.built:
      return
    super().build(var_list)
    self.mean_squares = [self.add_variable_from_reference(v, "mean_square", initializer="ones")
                         for v in var_list]
    self.momentums = [self.add_variable_from_reference(v, "momentum") for v in var_list]

  def update_step(self, gradient, variable, learning_rate):
    index = self._get_variable_index(variable)
    ms, mom = self.mean_squares[index], self.momentums[index]
    g = ops.cast(gradient, variable.dtype)
    if self._use_weight_decay(variable):
      g = g + self.decay * variable
    new_ms = self.rho * ms + (1 - self.rho) * ops.square(g)
    new_mom = self.momentum * mom + ops.cast(learning_rate, variable.dtype) * g / ops.sqrt(
        new_ms + self.epsilon)
    self.assign(ms, new_ms)
    self.assign(mom, new_mom)
    self.assign(variable, variable - new_mom)

  def get_config(self):
    config = super().get_config()
    config.update(rho=self.rho, momentum=self.momentum, epsilon=self.epsilon, decay=self.decay)
    return config


def make_rmsprop(opt_cfg, schedule, excluded_variables, dtype="float32"):
  """`excluded_variables`: no L2 term (batch norm's); `dtype`: the learning rate's."""
  optimizer = TfRmsProp(KerasSchedule(schedule, dtype), opt_cfg.decay, opt_cfg.momentum,
                        opt_cfg.epsilon, opt_cfg.weight_decay)
  optimizer.exclude_from_weight_decay(var_list=list(excluded_variables))
  return optimizer


class TfAdam(_TwoMoments):
  """Adam as TF's ApplyAdam (formula: jax_optimizers.tf_adam), the MLPerf Transformer
  reference's optimizer on dense gradients. Keras' own Adam computes the same update, but it
  has no flat rule for weight-update sharding and would re-sum the replicas' gradients."""

  def __init__(self, learning_rate, beta_1=0.9, beta_2=0.999, epsilon=1e-7, name="tf_adam",
               **kwargs):
    super().__init__(learning_rate=learning_rate, name=name, **kwargs)
    self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon

  def moment_update(self, variable, gradient, m, v, learning_rate, step):
    return adam_update(variable, gradient, m, v, learning_rate, step, **self.hyper())

  def hyper(self):
    return dict(beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon)

  def flat_update_rule(self):
    hyper = self.hyper()

    def rule(w, g, slots, lr, step, mask, layer_norm):
      del mask, layer_norm
      new_w, m, v = adam_update(w, g, slots["m"], slots["v"], lr, ops.cast(step, w.dtype),
                                **hyper)
      return new_w, {"m": m, "v": v}
    return rule, ("m", "v")

  def get_config(self):
    config = super().get_config()
    config.update(self.hyper())
    return config


def adam_update(w, g, m, v, lr, t, *, beta_1, beta_2, epsilon):
  """One TF Adam step at update count t (from 1) -> (new w, m, v)."""
  m = beta_1 * m + (1 - beta_1) * g
  v = beta_2 * v + (1 - beta_2) * ops.square(g)
  b1 = ops.convert_to_tensor(beta_1, w.dtype)
  b2 = ops.convert_to_tensor(beta_2, w.dtype)
  alpha = lr * ops.sqrt(1 - ops.power(b2, t)) / (1 - ops.power(b1, t))
  return w - alpha * m / (ops.sqrt(v) + epsilon), m, v


def make_adam(opt_cfg, schedule, dtype="float32"):
  """`dtype`: the learning rate's (float64 for float64 variables)."""
  return TfAdam(KerasSchedule(schedule, dtype), opt_cfg.beta_1, opt_cfg.beta_2, opt_cfg.epsilon)


class TorchAdagrad(_Optimizer):
  """Adagrad as torch.optim.Adagrad (formula: jax_optimizers.torch_adagrad), the MLPerf
  DLRM-DCNv2 reference's optimizer. Keras' Adagrad puts epsilon inside the square root."""

  def __init__(self, learning_rate, epsilon=1e-8, initial_accumulator_value=0.0,
               name="torch_adagrad", **kwargs):
    super().__init__(learning_rate=learning_rate, name=name, **kwargs)
    self.epsilon, self.initial_accumulator_value = epsilon, initial_accumulator_value

  def build(self, var_list):
    if self.built:
      return
    super().build(var_list)
    self.sums = [self.add_variable_from_reference(v, "sum", initializer=keras.initializers.Constant(
        self.initial_accumulator_value)) for v in var_list]

  def update_step(self, gradient, variable, learning_rate):
    total = self.sums[self._get_variable_index(variable)]
    new_w, new_sum = adagrad_update(variable, ops.cast(gradient, variable.dtype), total,
                                    ops.cast(learning_rate, variable.dtype), self.epsilon)
    self.assign(total, new_sum)
    self.assign(variable, new_w)

  def flat_update_rule(self):
    epsilon = self.epsilon

    def rule(w, g, slots, lr, step, mask, layer_norm):
      del step, mask, layer_norm
      new_w, total = adagrad_update(w, g, slots["sum"], lr, epsilon)
      return new_w, {"sum": total}
    return rule, ("sum",)

  def get_config(self):
    config = super().get_config()
    config.update(epsilon=self.epsilon, initial_accumulator_value=self.initial_accumulator_value)
    return config


def adagrad_update(w, g, total, lr, epsilon):
  """One torch Adagrad step -> (new w, new sum)."""
  total = total + ops.square(g)
  return w - lr * g / (ops.sqrt(total) + epsilon), total


def make_adagrad(opt_cfg, schedule, dtype="float32"):
  """`dtype`: the learning rate's (float64 for float64 variables)."""
  return TorchAdagrad(KerasSchedule(schedule, dtype), opt_cfg.epsilon,
                      opt_cfg.initial_accumulator_value)


class TorchAdamW(_TwoMoments):
  """AdamW as torch.optim.AdamW and Megatron's fused Adam in AdamW mode compute it (formula:
  jax_optimizers.make_adamw, optax.adamw), the MLPerf Llama 3.1 reference's optimizer. Keras'
  AdamW adds epsilon before the bias correction, and applies the decay before the moments.
  Weight decay applies to variables not excluded through `exclude_from_weight_decay(var_list=)`
  (norm scales: 1-D); the clip by global norm is Keras' `global_clipnorm` (the trainer
  all-reduces the gradients first, see _Optimizer)."""

  def __init__(self, learning_rate, beta_1=0.9, beta_2=0.95, epsilon=1e-5, weight_decay=0.1,
               clip_norm=1.0, name="torch_adamw", **kwargs):
    super().__init__(learning_rate=learning_rate, name=name,
                     global_clipnorm=clip_norm or None, **kwargs)
    self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
    self.decay_rate, self.clip_norm = weight_decay, clip_norm

  def moment_update(self, variable, gradient, m, v, learning_rate, step):
    decayed = 1.0 if self._use_weight_decay(variable) else 0.0
    return adamw_update(variable, gradient, m, v, learning_rate, step, decayed, **self.hyper())

  def hyper(self):
    return dict(beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon,
                weight_decay=self.decay_rate)

  def flat_update_rule(self):
    hyper = self.hyper()

    def rule(w, g, slots, lr, step, mask, layer_norm):
      del layer_norm
      new_w, m, v = adamw_update(w, g, slots["m"], slots["v"], lr, ops.cast(step, w.dtype), mask,
                                 **hyper)
      return new_w, {"m": m, "v": v}
    return rule, ("m", "v")

  def get_config(self):
    config = super().get_config()
    config.pop("global_clipnorm", None)              # it is clip_norm here
    config.update(self.hyper(), clip_norm=self.clip_norm)
    return config


def adamw_update(w, g, m, v, lr, t, decayed, *, beta_1, beta_2, epsilon, weight_decay):
  """One AdamW step at update count t (from 1) -> (new w, m, v); `decayed` 1.0/0.0 or a 0/1
  mask over elements."""
  m = beta_1 * m + (1 - beta_1) * g
  v = beta_2 * v + (1 - beta_2) * ops.square(g)
  m_hat = m / (1 - ops.power(ops.convert_to_tensor(beta_1, w.dtype), t))
  v_hat = v / (1 - ops.power(ops.convert_to_tensor(beta_2, w.dtype), t))
  update = m_hat / (ops.sqrt(v_hat) + epsilon) + decayed * weight_decay * w
  return w - lr * update, m, v


def make_adamw(opt_cfg, schedule, excluded_names, dtype="float32"):
  """`dtype`: the learning rate's (float64 for float64 variables); `excluded_names`: regular
  expressions of the variable names without weight decay (the norm scales). By name, not by
  variable: a model built from shapes alone (describe, tf_trainer_base) has variables whose
  identity Keras cannot key before they hold a value."""
  optimizer = TorchAdamW(KerasSchedule(schedule, dtype), opt_cfg.beta_1, opt_cfg.beta_2,
                         opt_cfg.epsilon, opt_cfg.weight_decay, opt_cfg.clip_norm)
  optimizer.exclude_from_weight_decay(var_names=list(excluded_names))
  return optimizer
