"""Every bad input: one line naming the bad value, exit code 2, no traceback, nothing written."""
import os

import pytest

from tests.conftest import ROOT

BAD_INPUTS = [
    (["run", "resnet5"], "unknown workload 'resnet5'"),
    (["run", "resnet50", "--framework", "torch"], "invalid choice: 'torch'"),
    (["run", "resnet50", "--preset", "huge"], "unknown preset 'huge' for resnet50"),
    (["train", "resnet50"], "invalid choice: 'train'"),
    ([], "a command is required"),
    (["run", "resnet50", "--set", "train.batch=3"], "train.batch: no such key"),
    (["run", "resnet50", "--set", "train.global_batch_size=big"], "'big': not a valid int"),
    (["run", "resnet50", "--set", "train.global_batch_size=-4"], "out of range"),
    (["run", "resnet50", "--set", "optimizer.momentum=1.5"], "optimizer.momentum=1.5 is out of range"),
    (["run", "resnet50", "--runs", "0"], "0 is out of range"),
    (["run", "resnet50", "--steps", "x"], "'x' is not an integer"),
    (["run", "resnet50", "--preset", "reference"], "--data-dir is required"),
    (["run", "resnet50", "--preset", "reference", "--data-dir", "{tmp}/nowhere"], "missing or empty"),
    (["run", "resnet50", "--preset", "reference", "--data-dir", "{tmp}/empty"], "missing or empty"),
    (["run", "resnet50", "--preset", "reference", "--data-dir", "{tmp}/other"], "--data-dir '{tmp}/other' lacks imagenet2012/; expected: a tensorflow-datasets data dir"),
    (["run", "bert", "--preset", "reference", "--data-dir", "{tmp}/bert_parts"], "lacks eval_10k, tf1_ckpt/model.ckpt-28252; expected: a folder with the MLPerf BERT TFRecords"),
    (["run", "bert", "--preset", "reference", "--data-dir", "{tmp}/bert_no_parts"], "lacks part-*; expected"),
    (["run", "resnet50", "--framework", "tf", "--cpu-devices", "2", "--spatial-partitions", "2"], "must be a multiple of 64"),
    (["run", "resnet50", "--cpu-devices", "8", "--bn-group-size", "3"], "--bn-group-size 3 does not divide the data axis (8)"),
    (["run", "resnet50", "--framework", "tf", "--cpu-devices", "8", "--bn-group-size", "3"], "--bn-group-size 3 does not divide the data axis (8)"),
    (["run", "resnet50", "--results", "{tmp}/file.txt/r.csv"], "cannot be written"),
    (["run", "resnet50", "--results", "/proc/cannot/write.csv"], "'/proc/cannot/write.csv' cannot be written"),
    (["run", "resnet50", "--results", "{tmp}/foreign.csv"], "other columns"),
    (["run", "resnet50", "--results", "{tmp}"], "is a directory"),
    (["run", "resnet50", "--tensorboard", "{tmp}/file.txt/tb"], "--tensorboard '{tmp}/file.txt/tb' cannot be created: '{tmp}/file.txt' is not a writable folder"),
    (["run", "resnet50", "--tensorboard", "{tmp}/file.txt"], "is a file; allowed: a folder"),
    (["run", "resnet50", "--tensorboard", "/proc/nope"], "--tensorboard '/proc/nope' cannot be created"),
    (["run", "efficientnet", "--framework", "tf", "--cpu-devices", "2", "--weight-update-sharding"], "the tf update of optimizer 'rmsprop' has no sharded rule"),
    (["summarize", "{tmp}/nothing.csv"], "no such file or folder"),
    (["summarize", "{tmp}/binary.csv"], "is not a readable result CSV"),
    (["summarize", "{tmp}/foreign.csv"], "missing columns"),
    (["summarize", "{tmp}/empty"], "holds no MLPerf results"),
    (["compare", "{tmp}/nothing.csv", "{tmp}/foreign.csv"], "no such file"),
    (["compare", "{tmp}/foreign.csv", "{tmp}/foreign.csv", "--threshold", "2"], "out of range"),
    (["compare", "{tmp}/foreign.csv", "{tmp}/foreign.csv", "--alpha", "0"], "argument --alpha: 0.0 is out of range; allowed: 0 < alpha < 1"),
    (["ab", "no-such-ref", "--workloads", "dlrm", "--out", "{tmp}/ab"], "unknown REF 'no-such-ref'; allowed: a commit, branch or tag"),
    (["ab", "HEAD", "--workloads", "resnet5", "--out", "{tmp}/ab"], "--workloads: unknown workload 'resnet5'; allowed: bert, dlrm"),
    (["ab", "HEAD", "--frameworks", "jax,torch", "--out", "{tmp}/ab"], "--frameworks: unknown framework 'torch'; allowed: jax, tf"),
    (["ab", "HEAD", "--workloads", "dlrm", "--preset", "huge", "--out", "{tmp}/ab"], "unknown preset 'huge' for dlrm"),
    (["ab", "HEAD", "--workloads", "dlrm", "--set", "train.batch=3", "--out", "{tmp}/ab"], "train.batch: no such key"),
    (["ab", "HEAD", "--rounds", "0"], "argument --rounds: 0 is out of range"),
    (["ab", "HEAD", "--workloads", "dlrm", "--out", "{tmp}/file.txt"], "--out '{tmp}/file.txt' is a file; allowed: a folder"),
    (["ab", "HEAD", "--workloads", "dlrm", "--out", "/proc/nope"], "--out '/proc/nope' cannot be written"),
    (["changepoints", "{tmp}/nothing.csv"], "no such file"),
    (["changepoints", "{tmp}/foreign.csv", "--alpha", "1"], "argument --alpha: 1.0 is out of range"),
    (["check", "{tmp}/nothing.log"], "no such log file"),
    (["check", "{tmp}/file.txt"], "has no submission_benchmark line"),
    (["describe", "resnet50", "--set", "model.width=0"], "model.width=0 is out of range"),
    (["run", "resnet50", "--framework", "tf", "--cpu-devices", "4", "--mesh", "data=8"], "needs 8 devices; 4 available"),
    (["run", "resnet50", "--mesh", "gpu=2"], "bad axis 'gpu=2'"),
    (["run", "resnet50", "--mesh", "data=3"], "not divisible by the data axis (3)"),
    (["run", "resnet50", "--mesh", "data=8", "--bn-group-size", "3"], "does not divide the data axis (8)"),
    (["run", "efficientnet", "--cpu-devices", "8", "--bn-group-samples", "24"], "--bn-group-samples 24 at 8 samples per replica makes groups of 3 replicas, which does not divide the data axis (8)"),
    (["run", "resnet50", "--spatial-partitions", "3"], "does not divide the height size 32"),
    (["run", "resnet50", "--set", "train.target=25"], "train.target=25.0 is out of range for top1_accuracy (fraction); allowed: 0 < target < 1"),
    (["run", "bert", "--set", "optimizer.epsilon=0"], "optimizer.epsilon=0.0 is out of range"),
    (["run", "transformer", "--framework", "tf", "--mesh", "data=1,model=2,spatial=2"], "--mesh model=2,spatial=2 in TF: its runtime splits weights without spatial partitioning"),
    (["run", "transformer", "--mesh", "data=1,model=8"], "--mesh model=8 does not divide the heads size 4; allowed: a divisor of 4"),
    (["run", "resnet50", "--mesh", "data=2,model=2"], "resnet50 has no dimension laid out on it"),
    (["run", "bert", "--framework", "tf", "--spatial-partitions", "2"], "bert has no dimension laid out on it"),
    (["run", "resnet50", "--mesh", "data=2,data=4"], "bad axis 'data=4'"),
    (["run", "resnet50", "--num-processes", "2", "--process-id", "1"], "needs HOST:PORT"),
    (["run", "resnet50", "--num-processes", "2", "--process-id", "2", "--coordinator", "127.0.0.1:9"], "parallel.process_id=2 is out of range"),
    (["run", "resnet50", "--num-processes", "2", "--coordinator", "127.0.0.1:9"], "needs --seed"),
    (["run", "resnet50", "--cpu-devices", "4", "--mesh", "data=8"], "needs 8 devices; 4 available"),
    (["run", "resnet50", "--cpu-devices", "8", "--mesh", "stage=8"], "--mesh stage=8 leaves a stage empty: the model has 4 layers to cut; allowed: stage <= 4"),
    (["run", "transformer", "--mesh", "stage=2", "--set", "parallel.stage_layers=3,0"], "parallel.stage_layers='3,0' does not cut 4 layers into 2 stages; allowed: 2 counts >= 1 summing to 4"),
    (["run", "transformer", "--cpu-devices", "4", "--mesh", "stage=2", "--set", "parallel.microbatches=5"], "parallel.microbatches=5 does not divide the per-replica batch (32 = 64 / 2 data replicas); allowed: a divisor of 32"),
    (["run", "ssd", "--set", "parallel.microbatches=2"], "ssd has no pipeline layers"),
    (["run", "bert", "--framework", "tf", "--mesh", "stage=2"], "--mesh stage=2 / parallel.microbatches=1 for BERT in TF: its pipeline runs in JAX only"),
    (["run", "transformer", "--framework", "tf", "--mesh", "stage=2,model=2"], "--mesh stage=2,model=2 in TF: its pipeline places whole stages on devices"),
    (["run", "transformer", "--mesh", "stage=2,expert=2"], "--mesh stage=2 with expert=2: the pipeline runs over stage, data and (JAX) model only"),
    (["run", "transformer", "--set", "parallel.microbatches=0"], "parallel.microbatches=0 is out of range"),
    (["simulate", "--workload", "transformer", "--preset", "mini", "--mesh", "stage=2", "--topology", "ring:2", "--peak-tflops", "-1"], "--peak-tflops -1.0 is out of range; allowed: > 0"),
    (["simulate", "--workload", "transformer", "--preset", "mini", "--mesh", "stage=2", "--topology", "ring:4", "--peak-tflops", "1"], "--mesh stage=2 needs 2 chips; --topology ring:4 has 4"),
    (["run", "transformer", "--framework", "tf", "--mesh", "data=1,stage=2", "--num-processes", "2", "--coordinator", "127.0.0.1:9", "--seed", "1"], "--mesh stage=2 in TF: its pipeline is one graph placed over one host's devices"),
    # ST-MoE expert layers
    (["run", "transformer", "--cpu-devices", "4", "--mesh", "data=2,expert=2"], "--mesh expert=2: model.moe.num_experts=0 (dense) has no experts to split"),
    (["run", "transformer", "--preset", "moe_mini", "--cpu-devices", "8", "--mesh", "data=1,expert=8"], "--mesh expert=8 does not divide the experts size 4; allowed: a divisor of 4"),
    (["run", "transformer", "--preset", "moe_mini", "--mesh", "data=2,expert=2", "--set", "model.moe.group_size=100"], "model.moe.group_size=100 does not divide the 384 tokens of a batch shard (64 rows x 24 over 4 data x expert devices); allowed: a divisor of 384"),
    (["run", "transformer", "--preset", "moe_mini", "--mesh", "stage=2"], "model.moe.num_experts with a GPipe pipeline (--mesh stage / parallel.microbatches) is not supported"),
    (["run", "transformer", "--preset", "moe_mini", "--framework", "tf", "--mesh", "data=1,expert=2,model=2", "--weight-update-sharding"], "--mesh expert=2 in TF: its expert axis runs on one host, without spatial partitioning or weight-update sharding"),
    (["run", "transformer", "--preset", "moe_mini", "--set", "model.moe.second_policy=top"], "model.moe.second_policy='top' is not allowed; choose one of: all, random"),
    (["run", "transformer", "--preset", "moe_mini", "--set", "model.moe.num_experts=1"], "model.moe.num_experts=1 is not allowed; allowed: 0 (dense) or >= 2 experts"),
    (["run", "transformer", "--preset", "moe_mini", "--mesh", "data=3,expert=2"], "train.global_batch_size=64 is not divisible by the data x expert devices the batch is split over (3 x 2); allowed: a multiple of 6"),
]


@pytest.fixture
def sandbox(tmp_path):
  (tmp_path / "empty").mkdir()
  (tmp_path / "file.txt").write_text("not a log\n")
  (tmp_path / "foreign.csv").write_text("a,b\n1,2\n")
  (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00\x81garbage\x00")
  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "mnist").mkdir()                      # a tfds dir without imagenet
  (tmp_path / "bert_parts").mkdir()
  (tmp_path / "bert_parts" / "part-00000-of-00500").write_text("")
  (tmp_path / "bert_no_parts").mkdir()
  (tmp_path / "bert_no_parts" / "eval_10k").write_text("")
  (tmp_path / "bert_no_parts" / "tf1_ckpt").mkdir()
  (tmp_path / "bert_no_parts" / "tf1_ckpt" / "model.ckpt-28252.index").write_text("")
  return tmp_path


def _snapshot(*dirs):
  return {os.path.join(d, f): os.path.getmtime(os.path.join(d, f))
          for top in dirs if os.path.isdir(top) for d, _, files in os.walk(top) for f in files}


@pytest.mark.parametrize("args, message", BAD_INPUTS, ids=[" ".join(a) or "none" for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(cli, sandbox, args, message):
  args = [a.replace("{tmp}", str(sandbox)) for a in args]
  before = _snapshot(str(sandbox), os.path.join(ROOT, "results"), os.path.join(ROOT, "logs"))
  proc = cli(*args, "--log-dir", str(sandbox / "logs")) if args[:1] == ["run"] else cli(*args)
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1, proc.stderr
  assert "Traceback" not in proc.stderr
  assert message.replace("{tmp}", str(sandbox)) in lines[0], lines[0]
  assert lines[0].startswith("run_benchmark.py: error: ")
  assert _snapshot(str(sandbox), os.path.join(ROOT, "results"),
                   os.path.join(ROOT, "logs")) == before
  assert not (sandbox / "logs").exists()


def test_every_subcommand_has_help(cli):
  for command in ("run", "list", "describe", "summarize", "compare", "ab", "changepoints",
                  "check", "report"):
    proc = cli(command, "--help")
    assert proc.returncode == 0 and "usage: run_benchmark.py " + command in proc.stdout


def test_list_names_workloads_frameworks_presets(cli):
  proc = cli("list")
  assert proc.returncode == 0
  assert "resnet50" in proc.stdout and "jax" in proc.stdout and "synthetic" in proc.stdout
