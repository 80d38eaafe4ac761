"""DLRM-DCNv2 training and evaluation in TensorFlow (Keras 3 model, custom loop), behind the
driver's Trainer API (the loop and tf.distribute in workloads/parallel/tf_trainer_base.py).
On a model axis the slab's shard is differentiated by each replica (its rows' gradients) and
summed over its data peers by the base; every dense weight is whole.

The slab's update is sparse where the layout allows (`sparse_tables`, on one replica without
weight-update sharding): its gradient stays tf.IndexedSlices, deduplicated (tf.unique, then the
rows of each id summed), and SparseTorchAdagrad updates the accumulator and the slab at those
rows only by scatter ops. Across replicas (data or model axis) and under weight-update sharding
the gradient is made dense, as before (`sparse_slab` says why)."""
import tensorflow as tf

from workloads.dlrm import spec, tf_model
from workloads.optim import tf_optimizers
from workloads.parallel.tf_trainer_base import StrategyTrainer


def deduplicated(grad: tf.IndexedSlices) -> tf.IndexedSlices:
  """The slices with each index once, its rows summed (tf.unique + unsorted_segment_sum)."""
  ids, inverse = tf.unique(grad.indices)
  values = tf.math.unsorted_segment_sum(grad.values, inverse, tf.shape(ids)[0])
  return tf.IndexedSlices(values, ids, grad.dense_shape)


def dense_gradient(grad):
  """A gradient as a dense tensor (IndexedSlices summed into the table's shape)."""
  return tf.convert_to_tensor(grad)


class SparseTorchAdagrad(tf_optimizers.TorchAdagrad):
  """TorchAdagrad (torch's formula, tf_optimizers.adagrad_update) that takes an IndexedSlices
  gradient on the rows it names: sum[ids] += g^2; w[ids] -= lr g / (sqrt(sum[ids]) + eps),
  g each id's rows summed. A row outside the slices has a zero gradient, which the dense
  update leaves as it is: the same result, reading and writing only the rows."""

  def update_step(self, gradient, variable, learning_rate):
    if not isinstance(gradient, tf.IndexedSlices):
      return super().update_step(gradient, variable, learning_rate)
    gradient = deduplicated(gradient)       # once more: a caller's slices may repeat ids
    total = self.sums[self._get_variable_index(variable)]
    ids, g = gradient.indices, tf.cast(gradient.values, variable.dtype)
    square = tf.square(g)
    new_total = tf.gather(_tf_variable(total), ids) + square
    step = tf.cast(learning_rate, variable.dtype) * g / (tf.sqrt(new_total) + self.epsilon)
    self.assign_add(total, tf.IndexedSlices(square, ids, gradient.dense_shape))
    self.assign_sub(variable, tf.IndexedSlices(step, ids, gradient.dense_shape))
    return None


def _tf_variable(variable):
  """The tf.Variable of a Keras one (a gather from it reads only the rows gathered)."""
  return getattr(variable, "value", variable)


class DlrmTrainer(StrategyTrainer):
  spec = spec.SPEC
  # The slab's update: sparse where the layout allows it (sparse_slab), else dense.
  sparse_tables = True

  def __init__(self, cfg, ctx):
    super().__init__(cfg, ctx)
    self.schedule = spec.schedule_for(cfg)

  def make_model(self, runtime):
    return tf_model.build(self.cfg, self.dtype, runtime)

  def make_optimizer(self):
    dtype = "float64" if self.model.variable_dtype == "float64" else "float32"
    opt = self.cfg.optimizer
    optimizer = SparseTorchAdagrad(tf_optimizers.KerasSchedule(self.schedule, dtype),
                                   opt.epsilon, opt.initial_accumulator_value)
    return optimizer, optimizer.learning_rate_schedule

  @property
  def sparse_slab(self) -> bool:
    """Whether the slab's update is sparse here: `sparse_tables` on one replica, the slab a
    Keras weight updated by the Keras optimizer (no weight-update sharding). Not across
    replicas: the base sums gradients with tf.distribute's all-reduce, which gathers slices
    through a cond on their lengths whose collectives mismatched between replicas in a mini
    run on data=2 ("Shape mismatch in the collective instance"); the runtime's own ordered
    all-gather (tf_runtime.all_gather) would need a hook in the base's sum."""
    rt = self.runtime
    return self.sparse_tables and not rt.distributed and not rt.weight_update_sharding

  def loss_and_grads(self, batch):
    """This replica's examples' binary cross entropy, summed and divided by the global batch
    (the sum over data replicas is the global mean; the base divides the whole weights'
    gradients by the model peers, who compute the same examples)."""
    with tf.GradientTape() as tape:
      variables = self.watch_variables(tape)
      logits = self.model(batch["dense"], batch["sparse"], training=True)
      losses = tf.nn.sigmoid_cross_entropy_with_logits(
          labels=tf.cast(batch["label"], logits.dtype), logits=logits)
      loss = tf.reduce_sum(losses) / self.cfg.train.global_batch_size
    # the slab's gather gives IndexedSlices: kept sparse (deduplicated) for the sparse
    # update, else dense for the base's sums and flat updates
    sparse = self.sparse_slab
    return loss, [deduplicated(g) if sparse and isinstance(g, tf.IndexedSlices)
                  else dense_gradient(g) for g in tape.gradient(loss, variables)]

  def eval_step(self, batch):
    logits = self.model(batch["dense"], batch["sparse"], training=False)
    return {"score": tf.sigmoid(logits), "label": batch["label"], "mask": batch["mask"]}


make_trainer = DlrmTrainer        # WorkloadSpec.trainer_modules: (cfg, ctx) -> the trainer
