"""GPipe's neutral schedule (harness/pipeline.py): the stage cut, the schedule's iterations and
bubble, the per-stage parameter summary; no framework."""
import pytest

from harness import mesh, pipeline
from harness.errors import UsageError
from harness.mesh import ParallelConfig


def test_balanced_cut_gives_earlier_stages_the_extra_layers():
  assert pipeline.stage_cut(range(16), 4) == (4, 4, 4, 4)
  assert pipeline.stage_cut(range(6), 4) == (2, 2, 1, 1)
  assert pipeline.stage_cut(range(4), 3, "1,2,1") == (1, 2, 1)
  assert pipeline.stage_ranges((2, 2, 1, 1)) == [(0, 2), (2, 4), (4, 5), (5, 6)]


@pytest.mark.parametrize("layers,stages,explicit", [(3, 4, ""), (4, 2, "4,0"), (4, 2, "1,2"),
                                                    (4, 2, "2,x"), (4, 3, "2,2")])
def test_a_cut_that_does_not_fit_is_a_usage_error(layers, stages, explicit):
  with pytest.raises(UsageError):
    pipeline.stage_cut(range(layers), stages, explicit)


@pytest.mark.parametrize("stages,microbatches", [(1, 1), (2, 1), (2, 4), (4, 8), (8, 32)])
def test_schedule_runs_each_micro_batch_once_per_stage_in_order(stages, microbatches):
  table = pipeline.schedule(stages, microbatches)
  assert len(table) == pipeline.iterations(stages, microbatches) == microbatches + stages - 1
  for k in range(stages):
    column = [row[k] for row in table if row[k] is not None]
    assert column == list(range(microbatches))                # each once, in order
  for i, row in enumerate(table):                             # k waits for k - 1's output
    for k in range(1, stages):
      if row[k] is not None:
        assert table[i - 1][k - 1] == row[k]
  idle = sum(slot is None for row in table for slot in row) / (stages * len(table))
  assert idle == pytest.approx(pipeline.bubble_fraction(stages, microbatches))
  assert pipeline.bubble_fraction(stages, microbatches) == (stages - 1) / (
      microbatches + stages - 1)


def test_stage_summary_counts_a_shared_parameter_on_each_stage_that_reads_it():
  layers = [("a", "a/.*|emb/.*"), ("b", "b/.*"), ("c", "c/.*|emb/.*")]
  sizes = {"a/w": 3, "b/w": 5, "c/w": 7, "emb/table": 100}
  assert pipeline.stage_summary(layers, (2, 1), sizes) == [
      {"layers": ["a", "b"], "parameters": 108}, {"layers": ["c"], "parameters": 107}]


def test_check_refuses_before_any_framework():
  ok = dict(workload="w", layers=list(range(4)), global_batch_size=64, data=2)
  pipeline.check(ParallelConfig(mesh="data=2,stage=2", microbatches=8), **ok)
  with pytest.raises(UsageError, match="does not divide the per-replica batch"):
    pipeline.check(ParallelConfig(mesh="data=2,stage=2", microbatches=5), **ok)
  with pytest.raises(UsageError, match="has no pipeline layers"):
    pipeline.check(ParallelConfig(microbatches=2), **{**ok, "layers": None})
  # which axes a pipeline combines with: harness.mesh's one table, for both frameworks
  spatial = ParallelConfig(mesh="data=1,stage=2,spatial=2")
  for framework in ("jax", "tf"):
    assert mesh.composition_refusal(framework, spatial.axes(), spatial) == (
        "--mesh stage=2 with spatial=2: the pipeline runs over stage, data and (JAX) model "
        "only; allowed: stage=K,data=D,model=M")
