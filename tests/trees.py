"""The tests' one comparison of two trees of arrays (parameters, gradients, optimizer state, a
TF model's weights by name): the same leaves by path first, then each leaf's values. Pairing
leaves with zip, as the eight helpers this replaces did, let a missing leaf pass."""
import jax
import numpy as np


def leaves_by_path(tree) -> dict:
  """{path: leaf} of any JAX tree (a dict of TF weights by name is one: paths "['name']")."""
  return {jax.tree_util.keystr(path): leaf
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def assert_trees_close(actual, expected, rtol, atol=0.0, *, atol_of_max=False, skip=(),
                       dtype=None):
  """`atol_of_max`: each leaf's atol is rtol x the expected leaf's largest magnitude (leaves of
  very different scales); `skip`: path endings left out (the caller says why); `dtype`: the
  dtype every actual leaf must have (a float64 test that ran in float32 would pass otherwise)."""
  got, want = leaves_by_path(actual), leaves_by_path(expected)
  missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
  assert not missing and not extra, (f"the trees differ: missing {missing[:5]}, "
                                     f"extra {extra[:5]}")
  assert got, "both trees are empty"
  for path, x in got.items():
    if skip and path.endswith(tuple(skip)):
      continue
    x, y = np.asarray(x), np.asarray(want[path])
    if dtype is not None:
      assert x.dtype == dtype, f"{path}: {x.dtype}, not {np.dtype(dtype)}"
    tolerance = rtol * float(np.max(np.abs(y))) if atol_of_max and y.size else atol
    np.testing.assert_allclose(x, y, rtol=rtol, atol=tolerance, err_msg=path)
