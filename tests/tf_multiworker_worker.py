"""One process of a multi-worker TF test run: trains the tiny ResNet for a few steps under
MultiWorkerMirroredStrategy (one CPU replica per worker), evaluates, and (worker 0) saves the
weights. With NUM_PROCESSES 1 it runs MirroredStrategy over DEVICES logical CPUs instead.

  python tests/tf_multiworker_worker.py OUT.npz NUM_PROCESSES PROCESS_ID PORT DEVICES [--die]
"""
import os
import sys

out, num_processes, process_id, port, devices = sys.argv[1:6]
os.environ["HARNESS_CPU_DEVICES"] = devices
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from harness.workload import RunContext  # noqa: E402
from tests.host_eval import tf_trainer_class  # noqa: E402
from tests.parallel.test_tf_distributed import tiny_config  # noqa: E402

cfg = tiny_config(num_processes=int(num_processes), process_id=int(process_id),
                  coordinator=f"127.0.0.1:{port}", heartbeat_timeout_s=5)
trainer = tf_trainer_class()(cfg, RunContext(seed=0, preset="mini"))   # eval via the host
trainer.init()
if "--die" in sys.argv:
  os._exit(3)                       # a process that dies after start-up
metrics = trainer.train(3)
evaluation = trainer.evaluate()
if int(process_id) == 0:
  np.savez(out, loss=metrics["loss"], accuracy=evaluation["top1_accuracy"],
           count=evaluation["count"], rows_seen=evaluation["rows_seen"], **{v.path: v.numpy() for v in trainer.model.variables})
print("worker done", process_id, flush=True)
