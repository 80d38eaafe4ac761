"""Llama 3.1 8B pre-training and its log-perplexity eval in TensorFlow (Keras 3 model, custom
loop), behind the driver's Trainer API. The loop and the distribution (tf.distribute: data
parallel, weight-update sharding, Megatron's layers on a model axis) live in
workloads/parallel/tf_trainer_base.py; this file says what is Llama's, as jax_trainer.py does.

Each replica's loss is its share of the global loss: its tokens' cross-entropy over the token
count all-reduced across replicas, so summing replica gradients gives the gradient of the
global mean, which AdamW clips by its global norm.
"""
import tensorflow as tf

from workloads.llama31_8b import spec, tf_model
from workloads.optim import tf_optimizers
from workloads.parallel import tf_model_parallel as mp
from workloads.parallel.tf_trainer_base import StrategyTrainer


class LlamaTrainer(StrategyTrainer):
  spec = spec.SPEC

  def __init__(self, cfg, ctx):
    spec.check_framework(cfg, "tf")         # a pipeline: JAX only, one line
    super().__init__(cfg, ctx)
    self.schedule = spec.schedule_for(cfg)

  def make_model(self, runtime):
    """`runtime`: its model axis makes the layers Megatron's (tf_model_parallel)."""
    return tf_model.build(self.cfg, self.dtype, runtime)

  def make_optimizer(self):
    # Megatron's param groups: the norm scales (1-D, RMSNorm's `scale`) are not decayed; the
    # update sees the TF variable, named as its layer's path: 'layer_0/input_norm/scale:0'
    optimizer = tf_optimizers.make_adamw(self.cfg.optimizer, self.schedule,
                                         [r"(^|/)scale(:\d+)?$"],
                                         dtype=self.model.dtype_policy.variable_dtype)
    return optimizer, optimizer.learning_rate_schedule

  def loss_and_grads(self, batch):
    with tf.GradientTape() as tape:
      variables = self.watch_variables(tape)
      loss = tf_model.replica_loss(self.model, batch)
    grads = tape.gradient(loss, variables)
    return loss, [tf.convert_to_tensor(g) for g in grads]

  def eval_step(self, batch):
    with mp.gathered_weights(self.model.runtime):   # whole logits
      logits = self.model(batch, training=False)
    return tf.stack(tf_model.eval_sums(self.model, logits, batch, batch["mask"]))


make_trainer = LlamaTrainer        # WorkloadSpec.trainer_modules: (cfg, ctx) -> the trainer
