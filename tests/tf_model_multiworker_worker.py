"""One process of a TF model-parallel run over several processes: the tiny Transformer, float64,
on --mesh data=1,model=2 with one CPU replica per worker (MultiWorkerMirroredStrategy: the model
axis across the processes, each holding its shard), two Adam steps; or, with NUM_PROCESSES 1,
the same mesh on DEVICES logical CPUs of one process. Each process saves its loss and the
weights its replicas hold (a shard under its model coordinate) to OUT.<process id>.npz.

  python tests/tf_model_multiworker_worker.py OUT NUM_PROCESSES PROCESS_ID PORT DEVICES
"""
import os
import sys

out, num_processes, process_id, port, devices = sys.argv[1:6]
os.environ["HARNESS_CPU_DEVICES"] = devices
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from harness.workload import RunContext  # noqa: E402
from tests.parallel.test_tf_model_parallel import tiny_config  # noqa: E402
from workloads.parallel import tf_layers  # noqa: E402
from workloads.parallel import tf_model_parallel as mp  # noqa: E402
from workloads.transformer import spec  # noqa: E402

cfg = tiny_config("data=1,model=2")
cfg.parallel.num_processes, cfg.parallel.process_id = int(num_processes), int(process_id)
cfg.parallel.coordinator, cfg.parallel.heartbeat_timeout_s = f"127.0.0.1:{port}", 5
trainer = spec.SPEC.make_trainer("tf", cfg, RunContext(seed=0, preset="tiny"))
trainer.dtype = "float64"
trainer.init()
losses = [trainer.train(1)["loss"] for _ in range(2)]
saved = {"loss": np.array(losses)}
for path, var in tf_layers.params_by_path(trainer.model).items():
  name = "/".join(path)
  if isinstance(var, mp.ShardedWeight):
    for m, component in var.replica_shards():
      saved[f"{name}#{m}"] = component.numpy()
  else:
    saved[name] = var.numpy()
np.savez(f"{out}.{process_id}.npz", **saved)
print("worker done", process_id, flush=True)
