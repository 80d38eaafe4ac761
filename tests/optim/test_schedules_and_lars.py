"""LARS against a numpy implementation of the MLPerf formula, step by step (in float64, JAX's
x64 switch scoped to the comparison), and the learning-rate schedule's formula."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from workloads.optim import jax_optimizers, schedules


def test_warmup_then_poly2_decay_formula():
  s = schedules.WarmupPolySchedule(base_lr=10.0, warmup_steps=100, decay_steps=900,
                                   end_lr=1e-4, power=2.0)
  assert s(0) == 0.0
  assert s(50) == pytest.approx(5.0)
  assert s(100) == pytest.approx(10.0)
  assert s(550) == pytest.approx(1e-4 + (10.0 - 1e-4) * 0.5**2)
  assert s(1000) == pytest.approx(1e-4)
  assert s(5000) == pytest.approx(1e-4)
  steps = jnp.arange(0, 1200, 7)
  # jnp in float32 (the trainers' precision, u = 2**-24 = 6e-8) against Python floats: a few
  # roundings of the result (<= 4u relative), plus (1 - progress) ** 2 keeping the absolute
  # error of progress (<= u): <= 2u * base_lr * (1 - progress) = 1.2e-6 * (1 - progress), under
  # rtol * lr + atol for every progress (1e-4 x**2 - 1.2e-6 x + 1e-7 > 0 for all x)
  np.testing.assert_allclose(np.asarray(s(steps, ops=jnp)), [s(int(t)) for t in steps],
                             rtol=1e-5, atol=1e-7)


def numpy_lars_step(params, grads, momenta, lr, wd, momentum, eta, decayed):
  """The MLPerf LARS update, written out for each parameter."""
  new_params, new_momenta = {}, {}
  for name, w in params.items():
    g = grads[name]
    if decayed[name]:
      w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
      trust = eta * w_norm / (g_norm + wd * w_norm) if w_norm > 0 and g_norm > 0 else 1.0
      v = momentum * momenta[name] + lr * trust * (g + wd * w)
    else:
      v = momentum * momenta[name] + lr * g
    new_momenta[name] = v
    new_params[name] = w - v
  return new_params, new_momenta


def test_mlperf_lars_matches_numpy_formula_step_by_step():
  rng = np.random.default_rng(0)                      # float64 weights and gradients
  params = {"conv": {"kernel": rng.normal(size=(3, 3, 4, 8))},
            "bn": {"scale": rng.normal(size=(8,)), "bias": rng.normal(size=(8,))},
            "dense": {"kernel": rng.normal(size=(8, 5)), "bias": np.zeros(5)}}
  flat = lambda tree: {"/".join(k.key for k in path): np.asarray(v)
                       for path, v in jax.tree_util.tree_leaves_with_path(tree)}
  decayed = {name: name.endswith("kernel") for name in flat(params)}
  schedule = schedules.WarmupPolySchedule(base_lr=2.0, warmup_steps=2, decay_steps=4,
                                          end_lr=1e-4, power=2.0)
  wd, momentum, eta = 2e-4, 0.9, 0.001
  tx = jax_optimizers.mlperf_lars(lambda step: schedule(step, ops=jnp), wd, momentum, eta)
  np_params, np_momenta = flat(params), {k: np.zeros_like(v) for k, v in flat(params).items()}
  with jax.enable_x64(True):
    state = tx.init(params)
    jparams = jax.tree.map(jnp.asarray, params)
    for step in range(6):
      grads = jax.tree.map(lambda p: rng.normal(size=p.shape), params)
      updates, state = tx.update(grads, state, jparams)
      jparams = optax.apply_updates(jparams, updates)
      np_params, np_momenta = numpy_lars_step(np_params, flat(grads), np_momenta,
                                              schedule(step), wd, momentum, eta, decayed)
      for name, value in flat(jparams).items():
        # float64 on both sides: norms of <= 288 terms and ~10 more roundings (u = 1.1e-16)
        # per step on unit-scale values, <= 2e-13 after 6 steps (the linear bound)
        assert value.dtype == np_params[name].dtype == np.float64
        np.testing.assert_allclose(value, np_params[name], rtol=1e-10, atol=1e-12,
                                   err_msg=f"step {step} {name}")


def test_optax_lars_differs_from_the_mlperf_definition():
  """Why the project has its own LARS: optax divides by ||g + wd*w||, MLPerf by ||g|| + wd*||w||."""
  w = {"kernel": jnp.array([1.0, 0.0])}
  g = {"kernel": jnp.array([0.0, 1.0])}
  ours = jax_optimizers.mlperf_lars(lambda _: 1.0, weight_decay=0.5, momentum=0.0, eta=1.0)
  theirs = optax.lars(1.0, weight_decay=0.5, trust_coefficient=1.0, eps=0.0, momentum=0.0)
  u_ours, _ = ours.update(g, ours.init(w), w)
  u_theirs, _ = theirs.update(g, theirs.init(w), w)
  # trust: MLPerf 1/(1+0.5) = 0.667; optax 1/||(0.5, 1)|| = 0.894. float32, a handful of
  # roundings (u = 6e-8) of exact small numbers: <= 5u = 3e-7
  np.testing.assert_allclose(u_ours["kernel"], -np.array([0.5, 1.0]) / 1.5, rtol=1e-6)
  assert not np.allclose(u_ours["kernel"], u_theirs["kernel"])


def test_decay_mask_selects_kernels_only():
  from workloads.resnet import jax_model
  model = jax_model.ResNet(stage_sizes=(1,), width=4, num_classes=3)
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3))))["params"]
  mask = jax_optimizers.decay_mask(params)
  leaves = jax.tree_util.tree_leaves_with_path(mask)
  for path, decayed in leaves:
    assert decayed == (path[-1].key == "kernel"), path
  assert sum(decayed for _, decayed in leaves) == 6      # stem, 3 block convs, proj, classifier


def test_the_tf_optimizers_without_a_sharded_rule_are_the_ones_the_cli_refuses():
  """An optimizer config says `tf_weight_update_sharding = False` exactly when its TF class
  inherits the base's flat_update_rule (which raises): the command line then refuses
  --weight-update-sharding before a run, instead of a NotImplementedError mid-run."""
  from workloads.optim import configs, tf_optimizers  # pylint: disable=import-outside-toplevel
  tf_class = {configs.LarsSgdConfig: tf_optimizers.MLPerfMomentum,
              configs.LarsPolyConfig: tf_optimizers.MLPerfMomentum,
              configs.SgdStepConfig: tf_optimizers.MLPerfMomentum,
              configs.LambConfig: tf_optimizers.MLPerfLamb,
              configs.RmsPropConfig: tf_optimizers.TfRmsProp,
              configs.AdamConfig: tf_optimizers.TfAdam}
  base = tf_optimizers._Optimizer.flat_update_rule  # pylint: disable=protected-access
  for config, optimizer in tf_class.items():
    has_rule = optimizer.flat_update_rule is not base
    assert getattr(config, "tf_weight_update_sharding", True) == has_rule, config.__name__


def test_torch_adagrad_and_the_dlrm_lr_policy_match_their_definitions():
  """torch.optim.Adagrad's update (sum += g^2; w -= lr g / (sqrt(sum) + eps)) step by step in
  numpy, at the rates of the DLRM reference's LRPolicyScheduler written out as its loop: warmup
  scale (step / warmup), then ((decay - done) / decay)^2 from decay_start, at least 1e-7, the
  last rate set between and after them (its own step counter starts at 1)."""
  policy = schedules.LrPolicySchedule(base_lr=0.5, warmup_steps=3, decay_start_step=5,
                                      decay_steps=4)
  rates, last = [], 0.5
  for n in range(1, 12):
    if n < 3:
      last = 0.5 * (1 - (3 - n) / 3)
    elif 5 <= n < 9:
      last = max(1e-7, 0.5 * ((4 - (n - 5)) / 4) ** 2)
    rates.append(last)              # between warmup and decay, and after it: frozen
  np.testing.assert_allclose([float(policy(s)) for s in range(11)], rates, rtol=1e-12)
  tx = jax_optimizers.torch_adagrad(lambda step: policy(step, ops=jnp), epsilon=1e-8)
  w = jnp.array([1.0, -2.0, 0.5])
  state, total, expected = tx.init(w), np.zeros(3), np.array(w)
  for step, g in enumerate([np.array([0.1, -0.3, 0.0]), np.array([0.2, 0.1, 0.05])] * 3):
    updates, state = tx.update(jnp.asarray(g, jnp.float32), state, w)
    w = w + updates
    total += g ** 2
    expected = expected - rates[step] * g / (np.sqrt(total) + 1e-8)
    np.testing.assert_allclose(w, expected, rtol=1e-6, atol=1e-6)   # float32 updates
