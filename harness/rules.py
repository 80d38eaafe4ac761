"""Reads rules/<benchmark>.yaml: targets, run counts, eval cadence, hyperparameter rules,
and the mlperf_logging ruleset (or custom checker config) that validates the logs."""
import dataclasses
import functools
import os

import yaml

from harness.errors import UsageError

RULES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rules")


@dataclasses.dataclass(frozen=True)
class Rules:
  benchmark: str
  title: str
  metric: str
  target: float
  runs_required: int
  eval_cadence: dict
  ruleset: str                   # mlperf_logging training ruleset, e.g. 4.0.0
  checker_config: str | None     # a custom rule file (absolute path) when MLPerf has none
  fixed: dict
  tunable: list
  raw: dict


def benchmarks() -> list[str]:
  return sorted(f[:-5] for f in os.listdir(RULES_DIR)
                if f.endswith(".yaml") and not f.endswith("_compliance.yaml"))


@functools.cache
def load(benchmark: str) -> Rules:
  path = os.path.join(RULES_DIR, f"{benchmark}.yaml")
  if not os.path.exists(path):
    raise UsageError(f"no rules for benchmark {benchmark!r}; known: {', '.join(benchmarks())}")
  with open(path) as f:
    raw = yaml.safe_load(f)
  compliance = raw["compliance"]
  config = compliance.get("config")
  return Rules(benchmark=raw["benchmark"], title=raw["title"], metric=raw["metric"],
               target=float(raw["target"]), runs_required=int(raw["runs_required"]),
               eval_cadence=raw["eval"], ruleset=str(compliance["ruleset"]),
               checker_config=os.path.join(RULES_DIR, config) if config else None,
               fixed=raw["hyperparameters"].get("fixed", {}),
               tunable=raw["hyperparameters"].get("tunable", []), raw=raw)
