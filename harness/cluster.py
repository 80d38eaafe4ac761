"""How the processes of a multi-process run find each other, read before any framework loads.

In order of precedence:
  flags       --coordinator/--num-processes/--process-id (any of them given: the environment
              is not read);
  slurm       an srun step: the variables JAX's own SLURM detection reads (SLURM_JOB_ID,
              SLURM_STEP_NODELIST, SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID). The frameworks
              resolve the peers themselves: JAX with jax.distributed.initialize's SLURM
              detection, TensorFlow with tf.distribute's SlurmClusterResolver; this module only
              checks the step is whole and consistent and takes the process count and id;
  tf_config   TF_CONFIG (a Kubernetes TF job sets one per worker): TensorFlow reads it with
              TFConfigClusterResolver; JAX takes its first task's address as the coordinator;
  kubernetes  an Indexed Job or JobSet pod: JOB_COMPLETION_INDEX (Kubernetes') is the process
              id, JAX_COORDINATOR_ADDRESS (JAX's own variable, which the pod spec points at the
              headless service of pod 0) the coordinator, HARNESS_NUM_PROCESSES the count
              (Kubernetes exposes no job size to a pod).
A partial or contradictory environment is a UsageError naming the variable. Neutral: reads the
environment only (imports neither TensorFlow nor JAX)."""
import dataclasses
import json
import os

from harness.errors import UsageError

SLURM_STEP = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
              "SLURM_LOCALID")          # what jax._src.clusters.SlurmCluster requires
K8S_INDEX, K8S_COORDINATOR, K8S_COUNT = ("JOB_COMPLETION_INDEX", "JAX_COORDINATOR_ADDRESS",
                                         "HARNESS_NUM_PROCESSES")
SOURCES = ("single", "flags", "slurm", "tf_config", "kubernetes")


@dataclasses.dataclass(frozen=True)
class Cluster:
  source: str                   # one of SOURCES
  num_processes: int = 1
  process_id: int = 0
  coordinator: str = ""         # HOST:PORT of process 0; "" where the framework resolves it
  detail: str = ""              # what was read, for the run's first line and `describe`
  slurm_port: int = 0           # slurm: the port JAX's detection picks (TF workers start there)
  gpus_on_node: int = 0         # slurm: SLURM_GPUS_ON_NODE (0: a CPU step)
  gpus_per_task: int = 0        # slurm: SLURM_GPUS_PER_TASK (0: the node's GPUs over its tasks)

  def line(self) -> str:
    if self.source == "single":
      return f"cluster: one process ({self.detail})"
    where = self.coordinator or "resolved by the framework"
    return (f"cluster: {self.source}, process {self.process_id} of {self.num_processes}, "
            f"coordinator {where} ({self.detail})")


def _int(env, name, low=0, high=None):
  text = env.get(name, "")
  if not text.strip().isdigit() or int(text) < low or (high is not None and int(text) > high):
    allowed = f"{low}..{high}" if high is not None else f"an integer >= {low}"
    raise UsageError(f"{name}={text!r} is out of range; allowed: {allowed}")
  return int(text)


def _slurm(env) -> Cluster | None:
  present = [name for name in SLURM_STEP if name in env]
  if not present:
    return None
  if len(present) < len(SLURM_STEP):
    tasks = env.get("SLURM_NTASKS", "1")
    if "SLURM_PROCID" not in env or (tasks.isdigit() and int(tasks) <= 1):
      return Cluster("single", detail="a SLURM allocation outside an srun step")
    missing = next(name for name in SLURM_STEP if name not in env)
    raise UsageError(f"{missing} is not set, but SLURM_NTASKS={tasks}: this is not an srun "
                     "step (the batch script itself?); allowed: srun python run_benchmark.py "
                     "... (docs/cluster/slurm.sbatch)")
  tasks = _int(env, "SLURM_NTASKS", 1)
  if "SLURM_STEP_NUM_TASKS" in env and _int(env, "SLURM_STEP_NUM_TASKS", 1) != tasks:
    raise UsageError(f"SLURM_STEP_NUM_TASKS={env['SLURM_STEP_NUM_TASKS']} contradicts "
                     f"SLURM_NTASKS={tasks}; allowed: the same task count")
  nodes = _int(env, "SLURM_JOB_NUM_NODES", 1) if "SLURM_JOB_NUM_NODES" in env else 1
  if tasks < nodes:
    raise UsageError(f"SLURM_NTASKS={tasks} on a {nodes}-node allocation "
                     f"(SLURM_JOB_NUM_NODES={nodes}): some nodes would run nothing; allowed: "
                     "at least one task per node (srun --ntasks-per-node=N)")
  process_id = _int(env, "SLURM_PROCID", 0, tasks - 1)
  _int(env, "SLURM_LOCALID", 0)
  job = _int(env, "SLURM_JOB_ID", 0)
  if tasks > 1 and "SLURM_STEP_TASKS_PER_NODE" not in env:
    raise UsageError("SLURM_STEP_TASKS_PER_NODE is not set (TensorFlow's SlurmClusterResolver "
                     "places tasks by it); allowed: a SLURM step started by srun, which sets it")
  gpus = _int(env, "SLURM_GPUS_ON_NODE", 0) if "SLURM_GPUS_ON_NODE" in env else 0
  per_task = _int(env, "SLURM_GPUS_PER_TASK", 1) if "SLURM_GPUS_PER_TASK" in env else 0
  # jax._src.clusters.SlurmCluster's port: 61440 + job id mod 4096 on the first node
  port = job % 2**12 + (65535 - 2**12 + 1)
  detail = (f"SLURM_JOB_ID={job}, {tasks} tasks on SLURM_STEP_NODELIST="
            f"{env['SLURM_STEP_NODELIST']}, SLURM_STEP_TASKS_PER_NODE="
            f"{env.get('SLURM_STEP_TASKS_PER_NODE', '1')}, "
            + (f"{per_task or '-'} GPUs per task of {gpus} a node" if gpus else "no GPUs"))
  return Cluster("slurm", tasks, process_id, "", detail, port, gpus, per_task)


def _tf_config(env) -> Cluster | None:
  if not env.get("TF_CONFIG"):
    return None
  text = env["TF_CONFIG"]
  try:
    config = json.loads(text)
    cluster, task = config["cluster"], config["task"]
    kind, index = task["type"], task["index"]
  except (ValueError, KeyError, TypeError):
    raise UsageError(f"TF_CONFIG={text[:80]!r} is not a TF_CONFIG; allowed: JSON "
                     '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", '
                     '"index": i}}') from None
  kinds = [k for k in ("chief", "worker") if cluster.get(k)]
  other = sorted(set(cluster) - {"chief", "worker"})
  if other or kind not in kinds:
    bad = other[0] if other else kind
    raise UsageError(f"TF_CONFIG task type {bad!r} is not run here; allowed: "
                     "chief (at most one) and worker tasks")
  tasks = [address for k in kinds for address in cluster[k]]
  if not isinstance(index, int) or not 0 <= index < len(cluster[kind]):
    raise UsageError(f"TF_CONFIG task index {index!r} is out of range for "
                     f"{len(cluster[kind])} {kind} task(s); allowed: 0..{len(cluster[kind]) - 1}")
  process_id = index + (len(cluster.get("chief", [])) if kind == "worker" else 0)
  return Cluster("tf_config", len(tasks), process_id, tasks[0],
                 f"TF_CONFIG {kind} {index} of {', '.join(f'{len(cluster[k])} {k}' for k in kinds)}")


def _kubernetes(env) -> Cluster | None:
  if K8S_INDEX not in env:
    return None
  for name in (K8S_COUNT, K8S_COORDINATOR):
    if not env.get(name):
      raise UsageError(f"{name} is not set, but {K8S_INDEX}={env[K8S_INDEX]} (a Kubernetes "
                       "Indexed Job): the pod spec must set it (docs/cluster/jobset.yaml)")
  count = _int(env, K8S_COUNT, 1)
  index = _int(env, K8S_INDEX, 0, count - 1)
  coordinator = env[K8S_COORDINATOR]
  return Cluster("kubernetes", count, index, coordinator,
                 f"{K8S_INDEX}={index}, {K8S_COUNT}={count}, {K8S_COORDINATOR}={coordinator}")


def detect(env=None) -> Cluster:
  """The cluster the environment describes (slurm, then tf_config, then kubernetes), else one
  process."""
  env = os.environ if env is None else env
  for read in (_slurm, _tf_config, _kubernetes):
    found = read(env)
    if found is not None:
      return found
  return Cluster("single", detail="no --coordinator, srun step, TF_CONFIG or Kubernetes index")
