"""`package CSV... --submitter NAME --system NAME --out DIR`: an MLPerf training submission
folder from the rows of result CSVs, laid out as the round's package checker reads it:

  DIR/training_vX.Y/<submitter>/results/<system>/<benchmark>/result_<i>.txt
  DIR/training_vX.Y/<submitter>/systems/<system>.json

(the round folder lets `check` and `summarize` find the ruleset, as in MLPerf's results repos).

- Rows: per (benchmark, framework, preset), the latest successful or aborted runs, as many as
  the round's package checker requires per benchmark (mlperf_logging's benchmark_meta), as
  `summarize` counts them; fewer is a one-line error. Each row's MLPerf log is copied (never
  moved) as result_<i>.txt, oldest first.
- Division: what the logs say (`submission_division`: closed only for a reference preset run
  with the reference config); `--division` must agree. One benchmark folder holds one
  division, one system (the rows' `system`, device kind and count), one git commit and one
  framework. Rows of two frameworks become two systems, <system>-jax and <system>-tf: a
  system description names one framework. A benchmark MLPerf does not have (EfficientNet)
  goes to the open division under its own name, which the official checker skips.
- systems/<system>.json holds every field the round's system-description checker requires,
  read from the installed mlperf_logging (its check_system_desc), filled from what the runs
  recorded (accelerator kind and count, framework and versions, division, submitter), then
  from --system-json; what is still empty is listed in one line.
- Nothing is written until every check passed; an existing DIR is refused unless --force.
  The package checker (`check`) then runs on what was written and its verdict is printed.
"""
import ast
import inspect
import json
import os
import re
import shutil
import textwrap

from mlperf_logging import benchmark_meta
from mlperf_logging.system_desc_checker import system_desc_checker

from harness import results, rules
from harness.errors import UsageError

_DIVISION = re.compile(r'"key": "submission_division", "value": "(\w+)"')


def system_desc_rules() -> tuple[list[str], list[str]]:
  """(required fields, allowed `status` values) of the installed mlperf_logging's system
  description checker: local names of check_system_desc, read from its source (the package
  exposes them nowhere else)."""
  tree = ast.parse(textwrap.dedent(inspect.getsource(system_desc_checker.check_system_desc)))
  found = {node.targets[0].id: ast.literal_eval(node.value) for node in ast.walk(tree)
           if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
           and node.targets[0].id in ("required_fields", "availability_options")}
  return list(found["required_fields"]), list(found.get("availability_options", []))


def log_division(path: str) -> str:
  with open(path) as f:
    match = _DIVISION.search(f.read())
  if not match:
    raise UsageError(f"{path}: no submission_division in the log; allowed: logs written by "
                     "`run`")
  return match[1]


def select(frame, ruleset_of_benchmark) -> dict:
  """{(benchmark, framework, preset): the rows to package, oldest first}."""
  counts = benchmark_meta.get_result_file_counts("training")
  frame = frame[frame["preset"] != "synthetic"]
  picked = {}
  for (benchmark, framework, preset), group in frame.groupby(
      ["mlperf_benchmark", "framework", "preset"], sort=True):
    required = counts.get(benchmark) or rules.load(benchmark).runs_required
    done = group[group["status"].isin(["success", "aborted"])].sort_values("started_at")
    if len(done) < required:
      raise UsageError(f"{benchmark} ({framework}, {preset}): {len(done)} finished runs; the "
                       f"round needs {required} per benchmark; allowed: `run --runs "
                       f"{required}` first")
    rows = done.tail(required)
    for column, what in (("system", "systems"), ("git_commit", "git commits"),
                         ("device_kind", "device kinds"), ("num_devices", "device counts")):
      values = sorted(set(map(str, rows[column])))
      if len(values) > 1:
        raise UsageError(f"{benchmark} ({framework}, {preset}): the runs span {what} "
                         f"{', '.join(values)}; allowed: one per benchmark folder")
    ruleset_of_benchmark(benchmark)
    lost = [path for path in rows["log_path"] if not os.path.isfile(path)]
    if lost:
      raise UsageError(f"{benchmark} ({framework}, {preset}): the log {lost[0]!r} of a result "
                       "row does not exist; allowed: rows whose MLPerf logs are at log_path")
    picked[(benchmark, framework, preset)] = rows
  if not picked:
    raise UsageError("no finished runs to package in the CSVs; allowed: rows of `run`")
  return picked


def _system_json(rows, submitter, system, division, framework, required, statuses, given):
  """The system description: required fields from the rows and the arguments, then
  `given` (--system-json), the rest empty."""
  first = rows.iloc[0]
  versions = dict(item.split("=", 1) for item in str(first["versions"]).split(";") if "=" in item)
  stack = {"jax": ("jax", "flax", "optax"), "tf": ("tensorflow", "keras")}[framework]
  research = next((s for s in statuses if s.lower().startswith("research")), "research")
  desc = {field: "" for field in required}
  desc.update({
      "submitter": submitter, "division": division, "status": research, "system_name": system,
      "number_of_nodes": "1", "accelerators_per_node": str(int(first["num_devices"])),
      "accelerator_model_name": str(first["device_kind"]),
      "framework": ", ".join(f"{name} {versions[name]}" for name in stack if name in versions),
      "other_software_stack": ", ".join(f"{k} {v}" for k, v in versions.items()),
      "sw_notes": f"mlperf-tf-jax harness at git {first['git_commit']}"})
  desc.update(given)
  return desc


def build(csvs, submitter, system, out, division=None, system_json=None, force=False):
  """Writes the package; -> (org folder, ruleset, printed lines)."""
  for name, value in (("--submitter", submitter), ("--system", system)):
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", value or ""):
      raise UsageError(f"{name} {value!r}: allowed: letters, digits, '.', '_', '-' (a folder "
                       "name)")
  if os.path.exists(out) and not force:
    raise UsageError(f"--out {out!r} exists; allowed: a new folder, or --force to write into it")
  given = {}
  if system_json:
    try:
      with open(system_json) as f:
        given = json.load(f)
    except (OSError, ValueError) as e:
      raise UsageError(f"--system-json {system_json!r}: {e}") from None
    if not isinstance(given, dict):
      raise UsageError(f"--system-json {system_json!r}: allowed: a JSON object of fields")
  frame = _read(csvs)
  rulesets = {}
  picked = select(frame, lambda b: rulesets.setdefault(b, rules.load(b).ruleset))
  if len(set(rulesets.values())) > 1:
    raise UsageError("the runs span MLPerf rounds " + ", ".join(
        f"{b} {r}" for b, r in sorted(rulesets.items())) + "; allowed: one round per package")
  ruleset = next(iter(rulesets.values()))
  known = set(benchmark_meta.get_allowed_benchmarks("training", ruleset))
  frameworks = sorted({framework for _, framework, _ in picked})
  required, statuses = system_desc_rules()
  lines, plan, folders = [], [], {}
  for (benchmark, framework, preset), rows in picked.items():
    divisions = sorted({log_division(path) for path in rows["log_path"]})
    if len(divisions) > 1:
      raise UsageError(f"{benchmark} ({framework}, {preset}): the logs mix divisions "
                       f"{' and '.join(divisions)}; allowed: one per benchmark folder")
    found = divisions[0]
    if benchmark not in known:
      found = "open"
      lines.append(f"{benchmark}: no MLPerf {ruleset} benchmark of that name; packaged in the "
                   "open division under its own name (the official checker skips it)")
    if division and division != found:
      raise UsageError(f"--division {division}: the {benchmark} runs ({framework}, {preset}) "
                       f"are {found}-division (their logs say so); allowed: --division {found}")
    name = system if len(frameworks) == 1 else f"{system}-{framework}"
    key = (name, benchmark)
    if key in folders:
      raise UsageError(f"{benchmark} ({framework}): runs of presets {folders[key]} and "
                       f"{preset} would share {name}/{benchmark}; allowed: one preset per "
                       "benchmark and framework")
    folders[key] = preset
    plan.append((name, benchmark, framework, found, rows))
  descs, missing = {}, {}
  for name, benchmark, framework, found, rows in plan:
    desc = _system_json(rows, submitter, name, found, framework, required, statuses, given)
    if name in descs and descs[name]["division"] != desc["division"]:
      raise UsageError(f"system {name}: runs of both divisions; allowed: one division a "
                       "system")
    descs[name] = desc
    missing[name] = [field for field in required if desc.get(field, "") == ""]
  org = os.path.join(out, f"training_v{ruleset.rsplit('.', 1)[0]}", submitter)
  for name, benchmark, _, _, rows in plan:               # every check passed: now write
    folder = os.path.join(org, "results", name, benchmark)
    if os.path.isdir(folder):
      shutil.rmtree(folder)                              # --force: this folder anew
    os.makedirs(folder)
    for i, path in enumerate(rows["log_path"]):
      shutil.copyfile(path, os.path.join(folder, f"result_{i}.txt"))
    lines.append(f"{name}/{benchmark}: {len(rows)} runs ({descs[name]['division']} division)")
  os.makedirs(os.path.join(org, "systems"), exist_ok=True)
  for name, desc in descs.items():
    with open(os.path.join(org, "systems", f"{name}.json"), "w") as f:
      json.dump(desc, f, indent=2)
      f.write("\n")
    if missing[name]:
      lines.append(f"systems/{name}.json: still to fill in ({len(missing[name])}): "
                   + ", ".join(missing[name]))
  return org, ruleset, lines


def _read(csvs):
  import pandas as pd  # pylint: disable=import-outside-toplevel
  frames = []
  for path in csvs:
    if not os.path.isfile(path):
      raise UsageError(f"{path!r}: no such result CSV")
    frame = results.read_csv(path)
    base = os.path.dirname(os.path.abspath(path))
    # a log path relative to where `run` was started (this folder), or to the CSV's folder
    frame["log_path"] = [p if os.path.isfile(p) else os.path.join(base, p)
                         for p in frame["log_path"].astype(str)]
    frames.append(frame)
  return pd.concat(frames, ignore_index=True)
