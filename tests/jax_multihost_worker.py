"""One process of a multi-host JAX test run: trains the tiny ResNet for a few steps on the mesh
spanning every process, evaluates through the host (tests/host_eval.py: every process's
outputs gathered), and (process 0) saves the parameters and the eval.

  python tests/jax_multihost_worker.py OUT.npz NUM_PROCESSES PROCESS_ID PORT DEVICES [--die]
"""
import os
import sys

out, num_processes, process_id, port, devices = sys.argv[1:6]
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_force_host_platform_device_count={devices}")
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from harness.workload import RunContext  # noqa: E402
from tests.host_eval import jax_trainer_class  # noqa: E402
from tests.parallel.test_jax_distributed import tiny_config  # noqa: E402

cfg = tiny_config(num_processes=int(num_processes), process_id=int(process_id),
                  coordinator=f"127.0.0.1:{port}", heartbeat_timeout_s=5)
trainer = jax_trainer_class()(cfg, RunContext(seed=0, preset="mini"))
trainer.init()
if "--die" in sys.argv:
  os._exit(3)                       # a process that dies after start-up
metrics = trainer.train(3)
evaluation = trainer.evaluate()
if int(process_id) == 0:
  import jax
  flat = {"/".join(str(k.key) for k in path): np.asarray(jax.device_get(v))
          for path, v in jax.tree_util.tree_leaves_with_path(trainer.state.params)}
  np.savez(out, loss=metrics["loss"], accuracy=evaluation["top1_accuracy"],
           count=evaluation["count"], rows_seen=evaluation["rows_seen"], **flat)
print("worker done", process_id, flush=True)
