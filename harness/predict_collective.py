"""The all-reduce NCCL runs across many nodes, which the simulator's schedules do not hold: a
double binary tree (docs/simulator.md#predict-time-to-train-at-scale).

The simulator's multinode algorithms are rings (one per rail, or inside and across nodes): a
ring across N nodes takes 2(N-1) latency steps, milliseconds a bucket at hundreds of nodes.
NCCL (from 2.4, "Massively Scale Your Deep Learning Training with NCCL 2.4", NVIDIA blog,
2019; Sanders, Speck and Traeff 2009 for the two trees) runs a chain inside each node and two
binary trees across the nodes, each tree half the data, so that every node is a leaf in one
tree and an inner node in the other: each node sends and receives twice the data once (as a
ring does) but the latency is 2 log2(N) steps, up and down, not 2(N-1).

Timed in closed form from the same figures the simulator uses (the preset's links, NICs and its
efficiency terms fitted to published NCCL measurements; nothing here is fitted):
  inside the node   a ring reduce-scatter and all-gather of the vector over the G GPUs:
                    2(G-1) steps of n/G bytes on a GPU's NVLink port
  across nodes      each GPU's shard n/G over its own rail (its share of the node's NICs):
                    2 (n/G) / rail + 2 ceil(log2 N) (network latency + the protocol's step)
                    + a step per piece of the shard (the pipeline)
under each of the library's protocols (its bandwidth fraction and step latency), the fastest,
plus the collective's launch.
"""
import math

from harness.commsim import machine as machine_lib


def tree_all_reduce_seconds(kwargs: dict, nodes: int, gpus: int, nbytes: float) -> float:
  """Seconds of an all-reduce of `nbytes` a GPU over `nodes` x `gpus` GPUs by NCCL's tree, on
  a machine given by the simulator's Machine keywords (`kwargs`)."""
  eff = kwargs.get("efficiency") or machine_lib.Efficiency()
  protocols = eff.protocols or (machine_lib.Protocol("ideal", kwargs.get("overhead", 0.0)),)
  port = kwargs["link_bandwidth"] * eff.link
  nics = kwargs.get("nics_per_node") or gpus
  rail = kwargs["network_bandwidth"] * eff.network * min(nics, gpus) / gpus
  levels = math.ceil(math.log2(nodes)) if nodes > 1 else 0
  shard = nbytes / gpus
  best = math.inf
  for p in protocols:
    pieces = max(1.0, shard / p.piece_bytes)
    intra = 0.0
    if gpus > 1:
      intra = 2 * (gpus - 1) * (kwargs.get("link_latency", 0.0) + p.step_latency * pieces
                                + shard / (port * p.bandwidth_fraction))
    inter = 0.0
    if levels:
      inter = (2 * shard / (rail * p.bandwidth_fraction)
               + 2 * levels * (kwargs.get("network_latency", 0.0) + p.step_latency)
               + p.step_latency * pieces)
    best = min(best, intra + inter)
  return eff.launch + best
