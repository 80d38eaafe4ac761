"""TensorBoard scalars for the neutral core, through tensorboardX (it imports neither
TensorFlow nor PyTorch).

A thin wrapper over `tensorboardX.SummaryWriter`: the library owns the event file (TFRecord
framing with masked crc32c, the Event and Summary protos, the writer thread); this module keeps
the driver's interface (`ScalarWriter(dir)`, `scalars(step, {tag: value})`, `close()`) and
names its file. The tests read the files back with TensorFlow's own TFRecord reader (which
verifies the checksums) and Event proto.
"""
import os

from tensorboardX import SummaryWriter

# tensorboardX queues events to a writer thread that flushes the file at most this often
# (its default is 2 minutes): `tensorboard --logdir DIR` sees a chunk's scalars about a
# second after it ends. close() writes and flushes whatever is queued.
FLUSH_SECS = 1


class ScalarWriter:
  """Appends scalars to DIR/events.out.tfevents.<time>.<host>.<pid>.<n> (`path`), one writer
  per run, so `tensorboard --logdir DIR` shows a run while it trains."""
  _count = 0

  def __init__(self, log_dir: str):
    ScalarWriter._count += 1
    suffix = f".{os.getpid()}.{ScalarWriter._count}"    # unique within the folder
    self._writer = SummaryWriter(log_dir, flush_secs=FLUSH_SECS, filename_suffix=suffix)
    # tensorboardX opens its file (with the file_version event) at once, named
    # events.out.tfevents.<time>.<host><suffix>
    self.path = next(os.path.join(log_dir, name) for name in os.listdir(log_dir)
                     if name.startswith("events.out.tfevents.") and name.endswith(suffix))

  def scalars(self, step: int, values: dict):
    """One point per tag at this step; None values (a figure this step lacks) are left out."""
    for tag, value in values.items():
      if value is not None:
        self._writer.add_scalar(tag, float(value), global_step=step)

  def close(self):
    self._writer.close()
