"""A collective-communication simulator for pod-scale machines (numpy only; no TF/JAX).

machine.py     topologies (ring, 2-D mesh, 2-D torus, multi-node), links, failures, routes
schedule.py    an algorithm's messages: stages run one after the other, tracks inside a stage
               run side by side, step by step
algorithms.py  ring, bidirectional ring, multi-ring, 2-D, hierarchical; routing around holes
functional.py  executes a schedule on data: every live chip must end with the exact sum
timing.py      alpha-beta with link contention on the same schedule
tables.py      what a user asks: comparisons, scaling, failed-chip slowdowns, the heat map
"""
