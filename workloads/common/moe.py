"""Sparse expert (ST-MoE) layers: the config and the closed forms both frameworks' routers read
(framework-neutral, so the two cannot disagree on them). jax_moe.py and tf_moe.py (in
workloads/parallel) route with them.

The router is Mesh-TF's top-2 gating (tensorflow/mesh transformer/moe.py, `_top_2_gating`) with
ST-MoE's router z-loss (Zoph et al. 2022, arXiv 2202.08906, eq. 5):
- tokens are split into groups of `group_size` consecutive tokens of the flattened batch x
  length; each group routes on its own, with a capacity of `capacity(...)` tokens per expert;
- router logits in float32 whatever the compute dtype ("selective precision");
- the top-1 expert always; the second by `second_policy`: "all", or "random" with probability
  min(1, gate_2 / second_threshold); both gates renormalized to sum to 1 before the policy and
  the capacity drops (a token whose second choice is dropped keeps gate_1 < 1, as Mesh-TF);
- top-1 assignments take their expert's slots first, in token order, then top-2 assignments,
  in token order; an assignment past the capacity is dropped; padding is routed nowhere;
- load-balance loss per group alpha * E * sum_e f_e * P_e, f_e the fraction of the group's
  tokens whose top-1 is e (before capacity drops), P_e the mean router probability of e, both
  over the group's positions with padding counted as zero (Mesh-TF); the mean over groups.
  Perfectly balanced routing gives exactly alpha. (MaxText and flaxformer count both choices
  in f and give 2 alpha; this is the paper's and Mesh-TF's convention.)
- router z-loss (1/B) sum_i (logsumexp_j x_ij)^2 over the B real tokens, on the raw logits.
Each MoE layer adds coefficient x loss to the training loss (Mesh-TF sums its layers' losses).
"""
import dataclasses

from harness.config import in_range, key_of, one_of
from harness.errors import UsageError

SECOND_POLICIES = ("all", "random")


@dataclasses.dataclass
class MoEConfig:
  """model.moe: every `every`-th feed-forward layer of the encoder and the decoder becomes a
  mixture of `num_experts` expert feed-forwards of the same shape (0: dense)."""
  num_experts: int = 0
  every: int = 4                      # ST-MoE: an expert layer every 4th layer
  group_size: int = 1024              # tokens routed together (Mesh-TF's moe_group_size)
  capacity_factor_train: float = 1.25
  capacity_factor_eval: float = 2.0
  min_expert_capacity: int = 4        # Mesh-TF's floor on the slots per expert and group
  second_policy: str = "random"       # training; Mesh-TF's default
  second_policy_eval: str = "all"     # deterministic eval (beam search draws no noise)
  second_threshold: float = 0.2
  load_balance_loss: float = 0.01     # alpha
  router_z_loss: float = 0.001        # c_z (ST-MoE section 3.2)

  def validate(self):
    in_range(self, "num_experts", 0, None)
    if self.num_experts == 1:
      raise UsageError(f"{key_of(self, 'num_experts')}=1 is not allowed; allowed: 0 (dense) "
                       "or >= 2 experts")
    in_range(self, "every", 1, None)
    in_range(self, "group_size", 1, None)
    in_range(self, "capacity_factor_train", 0.0, None)
    in_range(self, "capacity_factor_eval", 0.0, None)
    in_range(self, "min_expert_capacity", 1, None)
    one_of(self, "second_policy", SECOND_POLICIES)
    one_of(self, "second_policy_eval", SECOND_POLICIES)
    in_range(self, "second_threshold", 1e-9, None)
    in_range(self, "load_balance_loss", 0.0, None)
    in_range(self, "router_z_loss", 0.0, None)


def is_expert_layer(moe: MoEConfig, index: int) -> bool:
  """Whether layer `index` (0-based, of the encoder or the decoder) has the experts: the
  every-th, 2 every-th, ... (layers every-1, 2 every-1, ...)."""
  return moe.num_experts > 0 and index % moe.every == moe.every - 1


def expert_layer_count(moe: MoEConfig, num_layers: int) -> int:
  return sum(is_expert_layer(moe, i) for i in range(num_layers))


def capacity(group_size: int, num_experts: int, factor: float, minimum: int) -> int:
  """Slots per expert and group (Mesh-TF): min(group, floor(group * factor / E)), at least
  `minimum`."""
  return max(min(group_size, int(group_size * factor / num_experts)), minimum)


def group_count(tokens: int, group_size: int) -> int:
  """Groups of `tokens`: tokens / group_size; a call whose tokens do not fill whole groups
  (beam-search decoding: one position of every beam) routes them as one group."""
  return tokens // group_size if tokens % group_size == 0 else 1


def check_groups(moe: MoEConfig, global_batch_size: int, length: int, batch_shards: int):
  """UsageError unless each batch shard's training tokens are whole groups (a group never
  straddles devices, so routing is the same on any mesh)."""
  tokens = global_batch_size // max(batch_shards, 1) * length
  if moe.num_experts and tokens % moe.group_size:
    raise UsageError(f"{key_of(moe, 'group_size')}={moe.group_size} does not divide the "
                     f"{tokens} tokens of a batch shard ({global_batch_size} rows x {length} "
                     f"over {batch_shards} data x expert devices); allowed: a divisor of "
                     f"{tokens}")


def figures(moe: MoEConfig, hidden: int, filter_size: int, num_layers: int, stacks: int = 2,
            tokens_per_step: int = 0) -> dict:
  """describe's figures of the expert layers (`stacks`: encoder and decoder): the experts'
  parameters against the dense feed-forwards they replace; feed-forward FLOPs per token, dense
  against MoE (top-2: up to two experts per token, plus the router); and the values one
  training step's all-to-alls move: per expert layer the dispatch [E, groups, capacity, hidden]
  and the combine, forward and backward (4 tensors of E x capacity slots per group; a
  device keeps the 1/expert of them that are its own)."""
  layers = expert_layer_count(moe, num_layers) * stacks
  ffn = 2 * hidden * filter_size + filter_size + hidden
  router = hidden * moe.num_experts
  slots = moe.num_experts * capacity(moe.group_size, moe.num_experts, moe.capacity_factor_train,
                                     moe.min_expert_capacity)
  groups = tokens_per_step // moe.group_size
  return {"expert_layers": layers,
          "expert_parameters": layers * (moe.num_experts * ffn + router),
          "dense_parameters_replaced": layers * ffn,
          "ffn_flops_per_token_dense": 2 * 2 * hidden * filter_size,
          "ffn_flops_per_token_moe": 2 * (2 * 2 * hidden * filter_size) + 2 * router,
          "all_to_all_values_per_step": layers * 4 * groups * slots * hidden}


def dispatch_bytes(moe: MoEConfig, hidden: int, tokens: int, chips: int, value_bytes: int
                   ) -> int:
  """The bytes one chip's dispatch all-to-all carries (its groups' E x capacity slots of
  `hidden` values) when `tokens` a step are split over `chips` (data x expert)."""
  slots = moe.num_experts * capacity(moe.group_size, moe.num_experts, moe.capacity_factor_train,
                                     moe.min_expert_capacity)
  return tokens // chips // moe.group_size * slots * hidden * value_bytes


def report(metrics: dict) -> tuple[str, dict]:
  """A block's router figures ({z_loss, balance_loss, dropped, tokens, load [E]}, host
  numbers) -> (the progress line's part, TensorBoard scalars). load_e is expert e's share of
  the top-1 assignments (1/E when balanced)."""
  tokens = max(float(metrics["tokens"]), 1.0)
  load = [float(n) for n in metrics["load"]]
  shares = [n / max(sum(load), 1.0) for n in load]
  dropped = float(metrics["dropped"]) / tokens
  scalars = {"router/z_loss": float(metrics["z_loss"]),
             "router/balance_loss": float(metrics["balance_loss"]),
             "router/dropped_fraction": dropped,
             **{f"router/load_expert_{e}": share for e, share in enumerate(shares)}}
  line = (f"router z {scalars['router/z_loss']:.4g} balance "
          f"{scalars['router/balance_loss']:.4g} dropped {100 * dropped:.2f}% load "
          + "/".join(f"{share:.2f}" for share in shares))
  return line, scalars


def block_metrics(steps: list) -> dict:
  """Router figures of one step each (host numbers) -> the block's: z and balance losses
  averaged over the steps, token, drop and load counts summed."""
  total = {k: sum(step[k] for step in steps) for k in steps[0]}
  total["z_loss"] = total["z_loss"] / len(steps)
  total["balance_loss"] = total["balance_loss"] / len(steps)
  return total
