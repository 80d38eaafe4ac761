"""Writes a small dataset in the real tfds `imagenet2012` format (the real builder's features,
TFRecord shards, dataset_info.json), so the loader is tested exactly as it reads ImageNet."""
import numpy as np
import tensorflow_datasets as tfds


def write_imagenet2012(data_dir, train_examples=30, eval_examples=21, seed=0):
  base = tfds.builder_cls("imagenet2012")

  class SmallImagenet2012(base, skip_registration=True):
    name = "imagenet2012"

    def _split_generators(self, dl_manager):
      return {"train": self._examples(train_examples, seed),
              "validation": self._examples(eval_examples, seed + 1)}

    def _examples(self, count, split_seed):
      rng = np.random.default_rng(split_seed)
      for i in range(count):
        height, width = rng.integers(40, 90, size=2)
        yield f"{split_seed}_{i}", {
            "image": rng.integers(0, 255, (height, width, 3), dtype=np.uint8),
            "label": int(rng.integers(0, 1000)), "file_name": f"n{split_seed}_{i}.JPEG"}

  builder = SmallImagenet2012(data_dir=str(data_dir))
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=str(data_dir)))
  return str(data_dir)
