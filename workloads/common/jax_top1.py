"""Top-1 image classification in JAX, shared by ResNet-50 and EfficientNet: the label-smoothed
cross entropy they train on and the eval step's [correct, counted] over a padded batch."""
import jax
import jax.numpy as jnp
import optax


def cross_entropy(logits, labels, num_classes, label_smoothing):
  """The batch mean of the label-smoothed softmax cross entropy."""
  targets = optax.smooth_labels(jax.nn.one_hot(labels, num_classes, dtype=logits.dtype),
                                label_smoothing)
  return optax.softmax_cross_entropy(logits, targets).mean()


def counts(logits, batch):
  """[correct, counted] of a padded eval batch (padding rows have mask 0)."""
  correct = (jnp.argmax(logits, -1) == batch["label"]) * batch["mask"]
  return jnp.stack([correct.sum(), batch["mask"].sum()])


def eval_counts(apply_fn, variables, batch):
  """The eval step of a batch-norm classifier: `counts` of the model with `variables`
  ({'params', 'batch_stats'}) in inference mode on batch['image']."""
  return counts(apply_fn(variables, batch["image"], train=False), batch)
