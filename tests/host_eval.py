"""ResNet trainers whose eval goes through the host (an Evaluator with on_host, as BLEU and
COCO mAP have): per-example outputs come to the host every batch, gathered from every replica
and process; accumulate keeps the real examples (mask 1) and finalize divides. Tests compare
them with the default on-device counts: the same accuracy, every eval example counted once."""



def _accumulate(acc, outputs):
  real = outputs["mask"] > 0
  acc = acc or {"correct": 0.0, "count": 0, "seen": 0}
  return {"correct": acc["correct"] + float(outputs["correct"][real].sum()),
          "count": acc["count"] + int(real.sum()), "seen": acc["seen"] + len(real)}


def _finalize(acc):
  return {"top1_accuracy": acc["correct"] / acc["count"], "count": acc["count"],
          "rows_seen": acc["seen"]}


class HostTop1:
  """harness.workload.Evaluator on the host: top-1 from per-example outputs."""
  on_host = True
  accumulate = staticmethod(_accumulate)
  finalize = staticmethod(_finalize)


def jax_trainer_class():
  import jax.numpy as jnp
  from workloads.resnet import jax_trainer

  class HostEvalResNet(jax_trainer.ResNetTrainer):
    def __init__(self, cfg, ctx):
      super().__init__(cfg, ctx)
      self.evaluator = HostTop1()

    def eval_step(self, state, batch):
      logits = state.apply_fn({"params": state.params, "batch_stats": state.batch_stats},
                              batch["image"], train=False)
      return {"correct": (jnp.argmax(logits, -1) == batch["label"]).astype(jnp.float32),
              "mask": batch["mask"]}
  return HostEvalResNet


def tf_trainer_class():
  import tensorflow as tf
  from workloads.resnet import tf_trainer

  class HostEvalResNet(tf_trainer.ResNetTrainer):
    def __init__(self, cfg, ctx):
      super().__init__(cfg, ctx)
      self.evaluator = HostTop1()

    def eval_step(self, batch):
      logits = self.model(batch["image"], training=False)
      correct = tf.argmax(logits, -1, output_type=tf.int32) == batch["label"]
      return {"correct": tf.cast(correct, tf.float32), "mask": batch["mask"]}
  return HostEvalResNet



