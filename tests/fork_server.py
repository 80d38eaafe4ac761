"""A fork server for the tests' command-line and multi-process runs.

Each `python run_benchmark.py ...` the tests start would spend ~8 s of CPU importing
TensorFlow, JAX, flax, optax and tfds before running a line of the project (this machine, 2
cores; ~30 such processes in a full run). This server imports those libraries once, and for
every request forks a child that becomes the requested process: its own session, working
directory, environment, argv, stdin from /dev/null, stdout and stderr to the files asked for,
then the script run as `__main__`, ending as an interpreter does (atexit, exit status). Only
third-party libraries are preloaded, never the project's own modules, and no framework runtime
is started before the fork (no JAX backend, no TF context), so the child starts its devices,
threads and flags itself, as a fresh process does.

Environment read at import time cannot change after the preload: JAX reads its config
variables (JAX_DISABLE_MOST_OPTIMIZATIONS) then. So a server serves one environment, the one
it was started with: `start` below asks the one for its environment (pytest's own PYTEST_*
variables aside), shared by every process of the test session (pytest-xdist's workers; see
`claim_session`), and starts it if none listens.

  python tests/fork_server.py SOCKET OWNER_PID
      (ends when SOCKET is removed, with its folder at the session's end, or when process
      OWNER_PID is gone: then it removes the folder itself)

It prints "ready CPU_S" (its CPU so far) once it listens. Per connection: one JSON line {argv,
cwd, env, stdout, stderr} in; {"pid": N} and then {"returncode": R, "cpu_s": S} out (R as
subprocess gives it: -signal when killed).
"""
import atexit
import fcntl
import gc
import hashlib
import importlib
import json
import os
import resource
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

# The cyclic collector's thresholds in every process the tests run (the xdist workers, this
# server and its children): tracing a TF or JAX step allocates millions of small objects, and at
# Python's (700, 10, 10) the collector ran ~3,700 young and ~15 full collections a file, each
# full one walking every object alive (TensorFlow's and JAX's modules, the traced graphs kept by
# module fixtures): 6-7% of a TF equality file's CPU (measured with gc.callbacks: 4.7 of 69 s
# in tests/parallel/test_tf_pipeline.py; 1.2 s at these thresholds, peak memory +3%; in a whole
# `.ci/run` the three xdist workers' collections 90 -> 28 s). Cycles are still collected, later.
GC_THRESHOLDS = (20000, 20, 20)


def settle_collector():
  """After the imports: what is alive now (the libraries' modules) leaves the collector's sight
  for good (gc.freeze), and the collector runs at GC_THRESHOLDS."""
  gc.collect()
  gc.freeze()
  gc.set_threshold(*GC_THRESHOLDS)


PRELOAD = ("numpy", "pandas", "yaml", "matplotlib", "tensorflow", "keras", "tensorflow_datasets",
           "jax", "jax.numpy", "flax.linen", "optax", "pycocotools.coco",
           "pycocotools.cocoeval", "mlperf_logging.mllog", "mlperf_logging.compliance_checker")


def serve(path, owner_pid):
  """Preloads, then forks per request; returns (in the forked child only) that request."""
  for name in PRELOAD:
    importlib.import_module(name)
  # Out of the collector's sight: a child's collections and its interpreter's teardown no
  # longer walk (and copy, page by page) the preloaded objects: a forked child's normal exit
  # 1.06 -> 0.26 s of CPU.
  settle_collector()
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  listener.bind(path)
  listener.listen(16)
  signal.signal(signal.SIGCHLD, signal.SIG_IGN)      # the kernel reaps the reporters below
  usage = resource.getrusage(resource.RUSAGE_SELF)
  try:
    print(f"ready {usage.ru_utime + usage.ru_stime}", flush=True)
  except BrokenPipeError:              # its starter has gone: the checks below end it if need be
    pass
  os.dup2(os.open(os.devnull, os.O_WRONLY), 1)    # the process that started it may end first
  while True:
    ready, _, _ = select.select([listener], [], [], 1.0)
    if not ready:                      # no request for a second: has the session ended?
      if not os.path.exists(path):
        os._exit(0)
      if not _alive(owner_pid):        # its owner ended without removing the folder (killed)
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        os._exit(0)
      continue
    conn, _ = listener.accept()
    try:
      with conn.makefile("r") as lines:
        request = json.loads(lines.readline())
    except ValueError:                 # not a request (its sender died): serve the others on
      conn.close()
      continue
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() == 0:
      signal.signal(signal.SIGCHLD, signal.SIG_DFL)
      listener.close()
      pid = os.fork()
      if pid == 0:
        conn.close()
        return request
      _report(conn, pid)
    conn.close()


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass
  return True


def _report(conn, pid):
  """The reporter between the server and a run: tells the run's pid, waits for the run, tells
  how it ended, and leaves without running anything of the server's."""
  try:
    conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
    _, status, usage = os.wait4(pid, 0)
    conn.sendall((json.dumps({"returncode": os.waitstatus_to_exitcode(status),
                              "cpu_s": usage.ru_utime + usage.ru_stime}) + "\n").encode())
  finally:
    os._exit(0)


def become(request):
  """Turns this forked child into the requested process, up to running its script."""
  os.setsid()                              # its own process group: a timeout kills it whole
  signal.signal(signal.SIGCHLD, signal.SIG_DFL)
  os.chdir(request["cwd"])
  os.environ.clear()
  os.environ.update(request["env"])
  os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
  flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
  os.dup2(os.open(request["stdout"], flags, 0o644), 1)
  if request["stderr"] == request["stdout"]:
    os.dup2(1, 2)
  else:
    os.dup2(os.open(request["stderr"], flags, 0o644), 2)
  argv = request["argv"]
  sys.argv = list(argv)
  sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))   # as `python SCRIPT` sets it
  runpy.run_path(argv[0], run_name="__main__")


# ----------------------------------------------------------------------------- the tests' end

# The servers of one test session live in one folder, a socket per environment, started by the
# first process that needs that environment and used by all (pytest-xdist's three workers each
# started both of its own before: ~8 s of CPU each). The folder and the pid that owns it are
# passed down in the environment, so xdist's workers, which inherit the controller's, find them.
SESSION_DIR_VAR, OWNER_PID_VAR = "HARNESS_FORK_SERVERS", "HARNESS_FORK_SERVERS_OWNER"
_CHILDREN_CPU_S = [0.0]          # CPU of the forked runs waited for (not in RUSAGE_CHILDREN)
_STARTED = []                    # the servers this process started (Popen objects kept alive)


def children_cpu_seconds():
  return _CHILDREN_CPU_S[0]


def claim_session():
  """Makes this process the owner of the session's servers, unless an ancestor already is:
  returns the folder to remove at the session's end (its servers then leave within a second),
  or None. A server also leaves when its owner is gone, however that ended."""
  inherited, owner = os.environ.get(SESSION_DIR_VAR), os.environ.get(OWNER_PID_VAR, "")
  if inherited and os.path.isdir(inherited) and owner.isdigit() and _alive(int(owner)):
    return None
  os.environ[SESSION_DIR_VAR] = tempfile.mkdtemp(prefix="harness-fork-servers-")
  os.environ[OWNER_PID_VAR] = str(os.getpid())
  return os.environ[SESSION_DIR_VAR]


def start(argv, cwd, env, merge_stderr=False):
  """`python ARGV` (ARGV[0] a script) in CWD with exactly ENV, forked from the server for ENV:
  a Popen-like ForkedProcess (stdout and stderr captured as text; merged if asked)."""
  # Under tests/conftest.py its controller owns a live session and this claims nothing; else
  # (no session, or one inherited from an owner that is gone) this process owns a new one.
  own = claim_session()
  if own:
    atexit.register(shutil.rmtree, own, True)
  return ForkedProcess(list(argv), cwd, env, merge_stderr)


UNREAD_AT_IMPORT = ("PYTEST_", "SLURM_", "TF_CONFIG", "JOB_COMPLETION_INDEX",
                    "HARNESS_NUM_PROCESSES", "JAX_COORDINATOR_ADDRESS", "XLA_FLAGS")


def _socket_path(env):
  # pytest's own variables (PYTEST_CURRENT_TEST changes with every test, PYTEST_XDIST_WORKER
  # with the worker) are read by nobody at import time, nor are a cluster's (SLURM_*,
  # TF_CONFIG, ...: harness/cluster.py reads them when a run starts): the child gets them, the
  # key leaves them out. XLA_FLAGS likewise: jaxlib's XLA and TensorFlow's each parse it at
  # their first compile (a flag set after `import jax, tensorflow` is read, an unknown one
  # refused), so runs that differ in it alone share a server.
  key = sorted((k, v) for k, v in env.items() if not k.startswith(UNREAD_AT_IMPORT))
  name = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]
  return os.path.join(os.environ[SESSION_DIR_VAR], f"{name}.socket")


def _connect(path):
  conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  try:
    conn.connect(path)
    return conn
  except (FileNotFoundError, ConnectionRefusedError):
    conn.close()
    return None


def _connect_or_start(env):
  """A connection to the session's server for ENV, which this process starts if none listens
  (one process at a time: the others wait on the lock, then use it)."""
  path = _socket_path(env)
  conn = _connect(path)
  if conn is not None:
    return conn
  with open(path + ".lock", "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    conn = _connect(path)
    if conn is not None:
      return conn
    if os.path.exists(path):                  # a server that has gone: not a listener
      os.remove(path)
    with open(path + ".log", "ab") as log:    # its own errors, apart from any test's output
      proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), path,
                               os.environ[OWNER_PID_VAR]],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                              env=env, cwd=os.path.dirname(path), start_new_session=True)
    _STARTED.append(proc)
    try:
      ready = proc.stdout.readline().split()
    except BaseException:                     # this process is being stopped: so is its server
      proc.kill()
      raise
    proc.stdout.close()
    if ready[:1] == [b"ready"]:
      _CHILDREN_CPU_S[0] += float(ready[1])   # its imports: the cost of the test that needed it
    conn = _connect(path)       # (if it did not start, another process's may have meanwhile)
  if conn is None:
    with open(path + ".log", errors="replace") as log:
      raise RuntimeError(f"the fork server did not start (exit status {proc.wait()}): "
                         + log.read()[-2000:])
  return conn


class ForkedProcess:
  """The parts of subprocess.Popen the tests use: pid, returncode, wait, communicate, kill."""

  def __init__(self, argv, cwd, env, merge_stderr):
    self.args = argv
    handle, self._stdout_path = tempfile.mkstemp(dir=os.environ[SESSION_DIR_VAR], suffix=".out")
    os.close(handle)
    self._stderr_path = self._stdout_path if merge_stderr else self._stdout_path[:-4] + ".err"
    self._merged = merge_stderr
    self._conn = _connect_or_start(env)
    request = {"argv": argv, "cwd": str(cwd), "env": env, "stdout": self._stdout_path,
               "stderr": self._stderr_path}
    self._conn.sendall((json.dumps(request) + "\n").encode())
    self._received = b""
    self.pid = self._reply(None)["pid"]
    self.returncode = None

  def _reply(self, timeout):
    """The reporter's next JSON line (a timeout leaves what has arrived for the next call)."""
    self._conn.settimeout(timeout)
    while b"\n" not in self._received:
      try:
        chunk = self._conn.recv(4096)
      except TimeoutError:
        raise subprocess.TimeoutExpired(self.args, timeout) from None
      if not chunk:
        raise RuntimeError(f"the fork server's reporter for {self.args} ended without a reply")
      self._received += chunk
    line, _, self._received = self._received.partition(b"\n")
    return json.loads(line)

  def wait(self, timeout=None):
    if self.returncode is None:
      reply = self._reply(timeout)
      self._conn.close()
      self.returncode = reply["returncode"]
      _CHILDREN_CPU_S[0] += reply["cpu_s"]
    return self.returncode

  def output_so_far(self) -> str:
    """What the run has written to its stdout (and merged stderr) until now."""
    with open(self._stdout_path, encoding="utf-8", errors="replace") as f:
      return f.read()

  def kill(self):
    """The run's whole process group (the run itself, if it has not yet made its own)."""
    for kill, target in ((os.killpg, self.pid), (os.kill, self.pid)):
      try:
        kill(target, signal.SIGKILL)
        return
      except ProcessLookupError:
        pass

  def communicate(self, timeout=None):
    """(stdout, stderr) as text, stderr None when merged; kills the run on a timeout."""
    try:
      self.wait(timeout)
    except subprocess.TimeoutExpired:
      self.kill()
      raise
    outputs = []
    for path in {self._stdout_path: None, self._stderr_path: None}:
      with open(path, encoding="utf-8", errors="replace") as f:
        outputs.append(f.read())
      os.remove(path)
    return outputs[0], (None if self._merged else outputs[1])


def run(argv, cwd, env, timeout=None):
  """subprocess.run(capture_output=True, text=True) on a forked run."""
  proc = start(argv, cwd, env)
  stdout, stderr = proc.communicate(timeout=timeout)
  return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


if __name__ == "__main__":
  become(serve(sys.argv[1], int(sys.argv[2])))
