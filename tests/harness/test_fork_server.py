"""The fork server (tests/fork_server.py) that starts the tests' command-line runs: a forked run
sees what `python SCRIPT` would (argv, sys.path[0], __name__, cwd, environment, stdin, exit
status, stdout apart from stderr), starts no framework runtime before its own code does, and a
timeout kills it."""
import json
import os
import subprocess
import sys
import time

import pytest

from tests import fork_server
from tests.conftest import ROOT, clean_env

_PROBE = r"""
import json, os, sys
from jax._src import xla_bridge
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "name": __name__, "cwd": os.getcwd(),
                  "env": dict(os.environ), "stdin": sys.stdin.read(),
                  "jax_backends": len(xla_bridge._backends)}))
print("to stderr", file=sys.stderr)
sys.exit(7)
"""


def test_a_forked_run_sees_what_a_fresh_process_does(tmp_path):
  script = tmp_path / "probe.py"
  script.write_text(_PROBE)
  env = clean_env()             # the server the command-line runs use: no start-up cost here
  args = [str(script), "--flag", "a b"]
  fresh = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True,
                         text=True, stdin=subprocess.DEVNULL)
  forked = fork_server.run(args, tmp_path, env)
  assert forked.returncode == fresh.returncode == 7
  assert forked.stderr == fresh.stderr == "to stderr\n"
  seen = json.loads(forked.stdout)
  assert seen == json.loads(fresh.stdout)
  assert seen["argv"] == args and seen["path0"] == str(tmp_path) and seen["name"] == "__main__"
  assert seen["env"] == env and seen["stdin"] == "" and seen["jax_backends"] == 0


_FIRST_COMPILE = r"""
import sys
if sys.argv[1] == "jax":
  import jax.numpy as jnp
  jnp.ones(2).block_until_ready()
else:
  import tensorflow as tf
  tf.function(lambda x: x + 1, jit_compile=True, autograph=False)(tf.ones(2))
"""


@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_xla_reads_the_runs_own_xla_flags(tmp_path, framework):
  """The server keys its environment without XLA_FLAGS: a run's own flags, set after the
  server imported jax and tensorflow, reach XLA at its first compile (an unknown one is
  refused there), so runs that differ in them alone can share a server."""
  script = tmp_path / "first_compile.py"
  script.write_text(_FIRST_COMPILE)
  env = clean_env()
  fine = fork_server.run([str(script), framework], tmp_path, env)
  assert fine.returncode == 0, fine.stderr[-2000:]
  bad = fork_server.run([str(script), framework], tmp_path,
                        dict(env, XLA_FLAGS=env["XLA_FLAGS"] + " --no_such_xla_flag_here"))
  assert bad.returncode != 0 and "Unknown flag in XLA_FLAGS: --no_such_xla_flag_here" in bad.stderr


def test_a_timeout_kills_the_forked_run(tmp_path):
  script = tmp_path / "sleeper.py"
  script.write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
  proc = fork_server.start([str(script)], tmp_path, clean_env(), merge_stderr=True)
  with pytest.raises(subprocess.TimeoutExpired):
    proc.communicate(timeout=2)
  assert proc.wait(timeout=30) == -9
  time.sleep(0.1)
  with pytest.raises(ProcessLookupError):
    os.kill(proc.pid, 0)


_SERVER_PID = r"""
import os
with open(f"/proc/{os.getppid()}/stat") as f:     # the run's parent reports to the server
  print(f.read().rsplit(")", 1)[1].split()[1])
"""


def test_every_process_of_the_session_uses_one_server_per_environment(tmp_path):
  """A run asked for by this test process and one asked for by another process of the session
  (as pytest-xdist's workers are: the session's folder in their environment) come from the same
  server; another environment has its own."""
  script = tmp_path / "server_pid.py"
  script.write_text(_SERVER_PID)
  env = clean_env()
  here = fork_server.run([str(script)], tmp_path, env)
  asks = (f"from tests import fork_server; import os; print(fork_server.run([{str(script)!r}], "
          f"{str(tmp_path)!r}, dict(os.environ)).stdout, end='')")
  # another worker's own pytest variables: not part of the server's environment
  worker_env = dict(env, PYTEST_XDIST_WORKER="gw9", PYTEST_CURRENT_TEST="other.py::test (call)")
  other_process = subprocess.run([sys.executable, "-c", asks], cwd=ROOT, env=worker_env,
                                 capture_output=True, text=True)
  other_env = fork_server.run([str(script)], tmp_path, clean_env(few_steps=True))
  # XLA_FLAGS alone differs: XLA reads it at its first compile, in the child
  emitters = fork_server.run([str(script)], tmp_path, clean_env(loop_emitters=True))
  assert other_process.returncode == 0, other_process.stderr[-3000:]
  assert here.returncode == other_env.returncode == emitters.returncode == 0, (
      here.stderr + other_env.stderr + emitters.stderr)
  assert int(here.stdout) == int(other_process.stdout) != int(other_env.stdout)
  assert int(emitters.stdout) == int(here.stdout)


def test_start_claims_a_new_session_when_the_inherited_one_is_gone(tmp_path, monkeypatch):
  """A caller outside the suite's controller that inherits a removed session folder (its owner
  gone) owns a new folder instead of failing to make its socket there; under a live owner
  (this session's controller) start claims nothing."""
  started = []
  monkeypatch.setattr(fork_server, "ForkedProcess", lambda *args: started.append(args))
  registered = []
  monkeypatch.setattr(fork_server.atexit, "register", lambda *args: registered.append(args))
  live = os.environ[fork_server.SESSION_DIR_VAR]
  fork_server.start(["x.py"], str(tmp_path), {})
  assert os.environ[fork_server.SESSION_DIR_VAR] == live and not registered
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True).stdout.strip()
  monkeypatch.setenv(fork_server.SESSION_DIR_VAR, str(tmp_path / "removed"))
  monkeypatch.setenv(fork_server.OWNER_PID_VAR, dead)
  fork_server.start(["x.py"], str(tmp_path), {})
  claimed = os.environ[fork_server.SESSION_DIR_VAR]
  assert claimed != str(tmp_path / "removed") and os.path.isdir(claimed)
  assert os.environ[fork_server.OWNER_PID_VAR] == str(os.getpid())
  assert registered == [(fork_server.shutil.rmtree, claimed, True)] and len(started) == 2
  os.rmdir(claimed)
