"""The one exception type the command line turns into a one-line message and exit code 2, and
the explainers that turn a framework's error about bad input (a corrupt data file) into one
line: a framework-side module registers one; the neutral core asks without importing it."""


class UsageError(Exception):
  """Bad input from the user: names the bad value and what is allowed."""


EXIT_USAGE = 2

_EXPLAINERS = []


def register_explainer(explain):
  """`explain(error) -> str | None`: one line for an error it knows, else None."""
  _EXPLAINERS.append(explain)
  return explain


def explained(error) -> str | None:
  for explain in _EXPLAINERS:
    line = explain(error)
    if line:
      return line
  return None


# The command's exit statuses (docs/running.md, "When a run ends by a fault"): 0 every run
# reached its target (or ran its synthetic steps), 1 a run aborted, 2 a usage error (nothing
# written), 3 a row that could not reach its result CSV (saved to the recovery CSV beside the
# log), 4 a lost peer; a signal ends with 128 + its number, as a shell reports it.
EXIT_ABORTED = 1
EXIT_ROW_NOT_SAVED = 3
EXIT_LOST_PEER = 4
