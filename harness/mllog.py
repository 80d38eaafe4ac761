"""MLPerf compliance logging through the official `mlperf_logging.mllog`.

Each run gets its own log file and its own `logging.Logger`, so several runs in one process
(`--runs 5`) never write into each other's files. Keys come from `mllog.constants`.
"""
import itertools
import logging
import os

from mlperf_logging.mllog import mllog
from mlperf_logging.mllog import constants

_ids = itertools.count()
_HARNESS_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class RunLog:
  """One MLPerf log file; `event/start/end` take the mllog keys and metadata."""

  def __init__(self, path: str, echo: bool = False, append: bool = False):
    self.path = path
    self._pylogger = logging.getLogger(f"mlperf_run_{next(_ids)}")
    self._pylogger.propagate = False
    self._pylogger.setLevel(logging.INFO)
    # append: a supervisor closing the log its child left open (harness/supervise.py)
    self._handler = logging.FileHandler(path, mode="a" if append else "w")
    self._pylogger.addHandler(self._handler)
    if echo:
      self._pylogger.addHandler(logging.StreamHandler())
    # stack_offset=2: the call site recorded in metadata is the driver line, not this wrapper.
    self._mllogger = mllog.MLLogger(logger=self._pylogger, default_stack_offset=2,
                                    root_dir=_HARNESS_ROOT)

  # time_ms is the event's own stamp, not metadata: the driver reads its clock once for
  # run_start/run_stop and gives that reading both to the log (what the official summarizer
  # scores) and to the row's time_to_train_s, so the two can never differ by a millisecond.
  # None: mllog reads its own clock, as for every other event.
  def event(self, key, value=None, time_ms=None, **metadata):
    self._mllogger.event(key=key, value=value, metadata=metadata or None, time_ms=time_ms)

  def start(self, key, value=None, time_ms=None, **metadata):
    self._mllogger.start(key=key, value=value, metadata=metadata or None, time_ms=time_ms)

  def end(self, key, value=None, time_ms=None, **metadata):
    self._mllogger.end(key=key, value=value, metadata=metadata or None, time_ms=time_ms)

  def close(self):
    for handler in list(self._pylogger.handlers):
      handler.flush()
      handler.close()
      self._pylogger.removeHandler(handler)


__all__ = ["RunLog", "constants"]
