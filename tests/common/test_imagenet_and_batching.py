import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tests.imagenet_format import write_imagenet2012
from workloads.common import batching, imagenet
from workloads.resnet import input_pipeline, spec


@pytest.fixture(scope="module")
def imagenet_dir(tmp_path_factory):
  return write_imagenet2012(tmp_path_factory.mktemp("tfds"), train_examples=30, eval_examples=21)


def _imagenet_cfg(image_size=64):
  cfg = spec.reference()
  cfg.data.image_size = image_size
  cfg.data.shuffle_buffer = 16
  return cfg


def test_imagenet2012_train_pipeline_on_tfds_mock_data(tmp_path):
  cfg = _imagenet_cfg()
  with tfds.testing.mock_data(num_examples=24):
    ds = input_pipeline.train_dataset(cfg, 8, seed=0, data_dir=str(tmp_path))
    batch = next(iter(ds.as_numpy_iterator()))
  assert batch["image"].shape == (8, 64, 64, 3) and batch["image"].dtype == np.float32
  assert batch["label"].shape == (8,) and batch["label"].dtype == np.int32
  assert 0 <= batch["label"].min() and batch["label"].max() < 1000
  # mean/std normalisation of 0..255 pixels: values within (0-123.68)/58.4 .. (255-103.9)/57.1
  assert batch["image"].min() >= -2.2 and batch["image"].max() <= 2.7


def test_imagenet2012_eval_counts_every_example_once_across_hosts(imagenet_dir):
  cfg = _imagenet_cfg()
  counts, labels = [], []
  for host in range(2):
    ds = input_pipeline.eval_dataset(cfg, 8, data_dir=imagenet_dir,
                                     process_index=host, process_count=2)
    batches = list(ds.as_numpy_iterator())
    assert len(batches) == 3                     # the same count on both hosts: 11 -> 3 x 4
    assert all(b["image"].shape == (4, 64, 64, 3) for b in batches)
    counts.append(sum(b["mask"].sum() for b in batches))
    labels += [l for b in batches for l, m in zip(b["label"], b["mask"]) if m]
  assert counts == [11, 10]                      # padding masked, every example once
  expected = [int(ex["label"]) for ex in tfds.load("imagenet2012", split="validation",
                                                   data_dir=imagenet_dir)]
  assert sorted(labels) == sorted(expected)


def test_imagenet2012_train_pipeline_on_the_real_tfds_format(imagenet_dir):
  cfg = _imagenet_cfg(image_size=48)
  ds = input_pipeline.train_dataset(cfg, 16, seed=1, data_dir=imagenet_dir)
  batches = list(ds.take(3).as_numpy_iterator())     # repeats past the 30 examples
  assert all(b["image"].shape == (16, 48, 48, 3) for b in batches)
  assert np.isfinite(np.stack([b["image"] for b in batches])).all()


def test_eval_preprocessing_is_resize_256_then_center_crop_224():
  image = np.zeros((300, 400, 3), np.uint8)
  image[:, 200:] = 255                            # right half white
  jpeg = tf.io.encode_jpeg(image, quality=100)
  out = imagenet._center_crop(jpeg, 224).numpy()
  assert out.shape == (224, 224, 3)
  # shorter side 300 -> 256, width 400 -> 341; crop columns 58..282; the edge at 170.7 -> 112.7
  row = out[112, :, 0]
  assert row[:110].max() < 20 and row[116:].min() > 235


def test_pad_and_batch_masks_padding():
  ds = tf.data.Dataset.from_tensor_slices({"x": np.arange(10, dtype=np.float32)})
  batches = list(batching.pad_and_batch(ds, 4).as_numpy_iterator())
  assert [b["mask"].tolist() for b in batches] == [[1] * 4, [1] * 4, [1, 1, 0, 0]]
  exact = list(batching.pad_and_batch(ds.take(8), 4).as_numpy_iterator())
  assert len(exact) == 2
  fixed = list(batching.pad_and_batch(ds, 4, num_batches=4).as_numpy_iterator())
  assert [b["mask"].sum() for b in fixed] == [4, 4, 2, 0]


def test_mini_dataset_is_deterministic_and_noisy_labelled():
  data = spec.mini().data
  a_img, a_lbl = imagenet.mini_arrays(data, 10, "train")
  b_img, b_lbl = imagenet.mini_arrays(data, 10, "train")
  np.testing.assert_array_equal(a_img, b_img)
  np.testing.assert_array_equal(a_lbl, b_lbl)
  e_img, _ = imagenet.mini_arrays(data, 10, "eval")
  assert e_img.shape == (data.eval_examples, 32, 32, 3)
  assert not np.allclose(e_img[:10], a_img[:10])
  # all 10 classes present, roughly balanced
  assert np.bincount(a_lbl, minlength=10).min() > data.train_examples / 10 * 0.7


def test_mini_hosts_yield_slices_of_the_same_global_batch():
  cfg = spec.mini()
  cfg.data.train_examples = 64
  cfg.data.shuffle_buffer = 64
  one = list(imagenet.mini_train(cfg.data, 10, 16, seed=3).take(4).as_numpy_iterator())
  hosts = [list(imagenet.mini_train(cfg.data, 10, 16, seed=3, process_index=i,
                                          process_count=2).take(4).as_numpy_iterator())
           for i in range(2)]
  for step, batch in enumerate(one):
    for key in ("image", "label"):
      joined = np.concatenate([hosts[0][step][key], hosts[1][step][key]])
      np.testing.assert_array_equal(joined, batch[key])
  # every image is an example of the set, possibly flipped
  full, _ = imagenet.mini_arrays(cfg.data, 10, "train")
  images = np.concatenate([b["image"] for b in one])
  nearest = [min(np.abs(full - x).sum((1, 2, 3)).min(),
                 np.abs(full[:, :, ::-1] - x).sum((1, 2, 3)).min()) for x in images]
  assert max(nearest) < 1e-3
