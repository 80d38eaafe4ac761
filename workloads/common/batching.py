"""Batching pieces every workload's tf.data pipeline shares (both frameworks read them):
host slicing of global batches, eval padding with a mask so every example counts once, the
eval step count every host runs, and TFRecord file sharding over hosts."""
import glob
import math
import os


from workloads.common.host_tf import tf
from workloads.common import records


def host_batch_size(global_batch_size, process_count):
  """Each host's share of a global batch: the one place it is computed (the mesh fit check
  has made it divide)."""
  return global_batch_size // process_count


def host_slice(ds, global_batch_size, process_index, process_count):
  """This host's contiguous slice of every global batch (replica order: host 0 first)."""
  if process_count == 1:
    return ds
  host = host_batch_size(global_batch_size, process_count)
  return ds.map(lambda b: {k: v[process_index * host:(process_index + 1) * host]
                           for k, v in b.items()})


def pad_and_batch(ds, batch_size, num_batches=None):
  """Batches an eval split, padding with mask=0 examples to full batches. With num_batches,
  pads (or would truncate) to exactly that many batches, so every host runs the same number of
  eval steps; without, drops an all-padding final batch."""
  ds = ds.map(lambda ex: {**ex, "mask": tf.constant(1.0)})
  element = ds.element_spec
  padding = tf.data.Dataset.from_tensors(
      {k: tf.zeros(spec.shape, spec.dtype) for k, spec in element.items()})
  if num_batches is not None:
    return ds.concatenate(padding.repeat()).take(num_batches * batch_size).batch(batch_size)
  ds = ds.concatenate(padding.repeat(batch_size - 1)).batch(batch_size, drop_remainder=True)
  return ds.filter(lambda batch: tf.reduce_max(batch["mask"]) > 0)


def eval_batches_per_host(eval_examples, host_batch_size, process_count):
  """Eval steps every host runs: enough for the largest host share (tfds.even_splits and
  Dataset.shard give hosts at most ceil(N / hosts) examples)."""
  return math.ceil(math.ceil(eval_examples / process_count) / host_batch_size)


def padded_eval(ds, eval_examples, global_batch_size, process_count):
  """This host's share `ds` of an eval split in padded batches of global/process_count; with
  several hosts, every host yields the same number of batches."""
  host = host_batch_size(global_batch_size, process_count)
  steps = (eval_batches_per_host(eval_examples, host, process_count)
           if process_count > 1 else None)
  return pad_and_batch(ds, host, steps)


def tfrecord_files(data_dir, pattern, what="TFRecords"):
  files = sorted(glob.glob(os.path.join(data_dir, pattern)))
  if not files:
    raise FileNotFoundError(f"no {what} match {os.path.join(data_dir, pattern)}")
  return records.noted(files)


def sharded_records(files, seed, process_index=0, process_count=1, cycle_length=8,
                    reader=None):
  """Shuffled, repeated records of this host: files are split over hosts when there are
  enough of them, records otherwise, so each example is read by exactly one host. `reader`
  turns a file name into its dataset (records, or rows made of one file's records; default
  tf.data.TFRecordDataset)."""
  reader = reader or tf.data.TFRecordDataset
  ds = tf.data.Dataset.from_tensor_slices(files)
  host_files = len(files)
  if len(files) >= process_count:
    ds = ds.shard(process_count, process_index)
    host_files = len(files[process_index::process_count])
  # At most this host's file count open at once: more slots would open the next epoch's
  # copies of the same files alongside them (one file a host: every record read twice in a row).
  ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True).repeat()
  ds = ds.interleave(reader, cycle_length=min(host_files, cycle_length),
                     num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
  if len(files) < process_count:
    ds = ds.shard(process_count, process_index)
  return ds
