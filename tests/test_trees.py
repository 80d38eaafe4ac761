"""The shared tree comparison refuses trees that differ in their leaves, not only in values."""
import numpy as np
import pytest

from tests.trees import assert_trees_close


def test_a_missing_or_extra_leaf_fails():
  a = {"dense": {"kernel": np.ones(3), "bias": np.zeros(3)}}
  with pytest.raises(AssertionError, match=r"missing \[\"\['dense'\]\['bias'\]\"\]"):
    assert_trees_close({"dense": {"kernel": np.ones(3)}}, a, rtol=0)
  with pytest.raises(AssertionError, match="extra"):
    assert_trees_close(a, {"dense": {"kernel": np.ones(3)}}, rtol=0)


def test_values_dtypes_and_scaled_tolerances():
  a = {"w": np.array([1.0, 1000.0]), "b": np.array([0.0])}
  assert_trees_close({"w": a["w"] * (1 + 1e-7), "b": a["b"]}, a, rtol=1e-6)
  with pytest.raises(AssertionError, match="'w'"):
    assert_trees_close({"w": a["w"] + 1e-3, "b": a["b"]}, a, rtol=1e-9)
  # atol_of_max: 1e-4 x 1000 = 0.1 absolute on every element of the leaf
  assert_trees_close({"w": a["w"] + 0.05, "b": a["b"]}, a, rtol=1e-4, atol_of_max=True)
  with pytest.raises(AssertionError, match="float32, not float64"):
    assert_trees_close({"w": a["w"].astype(np.float32), "b": a["b"]}, a, rtol=1e-3,
                       dtype=np.float64)
  assert_trees_close({"w": a["w"], "b": a["b"] + 9}, a, rtol=0, skip=("['b']",))
