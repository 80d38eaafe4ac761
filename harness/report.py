"""`report`: result CSVs (and the MLPerf logs their rows point to) -> one self-contained HTML
page: the summary table (summarize's olympic scores), eval metric against epochs or samples per
run with the target, time-to-train per run with the olympic score, baseline vs new (compare's
verdicts), and time to train, throughput and samples to target across git_commit / date (CI
history) with the change points harness/changepoints.py finds in it, at the commit where each
began.

Plots are matplotlib PNGs embedded as base64, so the page is one file a CI job can publish.
"""
import base64
import html
import io
import os

import matplotlib
matplotlib.use("Agg")                    # no display; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness import bench_table, changepoints, compare, registry, results, summarize  # noqa: E402
from harness.run_logs import eval_curve, resolve_log  # noqa: E402
from harness.errors import UsageError  # noqa: E402

GROUP = ["system", "mlperf_benchmark", "workload", "framework", "preset"]


def _png(fig) -> str:
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
  plt.close(fig)
  return base64.b64encode(buffer.getvalue()).decode()


def _img(b64, alt):
  return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}">'


def _label(key):
  return " ".join(str(k) for k in key)


def _curves_plot(frame, csv_of):
  fig, ax = plt.subplots(figsize=(7, 3.8))
  drawn = 0
  for key, group in frame.groupby(GROUP, sort=True):
    metric = registry.get(key[2]).metric
    color = f"C{drawn % 10}"
    for i, (_, row) in enumerate(group.iterrows()):
      log = resolve_log(row["log_path"], csv_of[row["run_id"]])
      points = eval_curve(log) if log else []
      if points:
        xs, ys = zip(*points)
        ax.plot(xs, [y / metric.log_scale for y in ys], marker="o", color=color, alpha=0.7,
                label=_label(key[2:]) if i == 0 else None)
    if pd.notna(group["target"]).any():
      ax.axhline(group["target"].dropna().iloc[0], color=color, linestyle="--",
                 label=f"target {group['target'].dropna().iloc[0]:g}")
    drawn += 1
  ax.set_xlabel("epoch_num (epochs, or samples for BERT) at eval")
  ax.set_ylabel("eval metric (its own units)")
  ax.set_title("Eval metric per run")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  return _png(fig)


def _ttt_plot(frame, scores):
  fig, ax = plt.subplots(figsize=(7, 3.5))
  keys = sorted(frame.groupby(GROUP).groups)
  for x, key in enumerate(keys):
    group = frame[(frame[GROUP] == pd.Series(key, index=GROUP)).all(axis=1)]
    ok = group[group["status"] == "success"]["time_to_train_s"] / 60
    ax.scatter([x] * len(ok), ok, color="C0", zorder=3,
               label="successful run" if x == 0 else None)
    failed = (group["status"] != "success").sum()
    if failed:
      ax.annotate(f"{failed} aborted", (x, ok.max() if len(ok) else 0), fontsize=7)
    score = scores.get((key[0], key[1], key[3], key[4]))
    if score is not None and pd.notna(score):
      ax.hlines(score, x - 0.3, x + 0.3, color="C3", linewidth=2,
                label="olympic score" if x == 0 else None)
  ax.set_xticks(range(len(keys)), [_label(k[2:]) for k in keys], fontsize=8)
  ax.set_ylabel("time to train (minutes)")
  ax.set_title("Time to train per run, with the olympic score")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  return _png(fig)


HISTORY_AXES = (("time_to_train_s", "time to train (s)"), ("throughput", "throughput (samples/s)"),
                ("samples_to_converge", "samples to target"))


def _history_plot(frame, changes):
  """Each group's runs across time, one panel per measure, and each change point (changepoints:
  the commit where the change began) a dashed line at that commit's first run in the group,
  labelled with the commit and the change of the segments' medians."""
  fig, axes = plt.subplots(len(HISTORY_AXES), 1, figsize=(7, 6.5), sharex=True)
  frame = frame.assign(when=pd.to_datetime(frame["started_at"], utc=True, errors="coerce"))
  for i, (key, group) in enumerate(frame.groupby(["workload", "framework", "preset"])):
    group = group.sort_values("when")
    ok = group[group["status"] == "success"]
    color = f"C{i % 10}"
    for ax, (column, _) in zip(axes, HISTORY_AXES):
      source = group if column == "throughput" else ok      # an aborted run's speed is real
      values = pd.to_numeric(source[column], errors="coerce")
      ax.plot(source["when"], values, marker="o", linestyle="none", color=color, alpha=0.45,
              markersize=4, label=_label(key) if column == HISTORY_AXES[0][0] else None)
      # the line: each commit's median at its first run, the points changepoints analyses
      per_commit = pd.DataFrame({"commit": source["git_commit"], "when": source["when"],
                                 "value": values}).dropna().groupby("commit", sort=False)
      medians = pd.DataFrame({"when": per_commit["when"].min(),
                              "value": per_commit["value"].median()}).sort_values("when")
      ax.plot(medians["when"], medians["value"], color=color, linewidth=1.2)
    for _, row in group.drop_duplicates("git_commit").iterrows():
      axes[1].annotate(str(row["git_commit"])[:7], (row["when"], row["throughput"]),
                       fontsize=6, rotation=30)
    mine = changes[(changes["workload"] == key[0]) & (changes["framework"] == key[1])
                   & (changes["preset"] == key[2])]
    for change in mine.itertuples():
      ax = axes[[c for c, _ in HISTORY_AXES].index(change.measure)]
      at = group.loc[group["git_commit"].astype(str).str.strip() == change.commit, "when"].min()
      ax.axvline(at, color=color, linestyle="--", linewidth=1.2)
      ax.annotate(f"{change.commit[:7]} {change.change:+.0%}", (at, 1), xycoords=(
          "data", "axes fraction"), fontsize=7, color=color, ha="left", va="top")
  for ax, (_, label) in zip(axes, HISTORY_AXES):
    ax.set_ylabel(label, fontsize=8)
    ax.grid(alpha=0.3)
  axes[0].set_title("History across git_commit / date (dashed: change points)")
  axes[0].legend(fontsize=7)
  fig.autofmt_xdate()
  return _png(fig)


def _compare_plot(table):
  fig, ax = plt.subplots(figsize=(7, 3.2))
  labels = [_label(k) for k in table[compare.KEYS].itertuples(index=False)]
  xs = range(len(table))
  ax.bar([x - 0.2 for x in xs], table["ttt_ratio"].fillna(0), width=0.4,
         label="time to train new/base")
  ax.bar([x + 0.2 for x in xs], table["throughput_ratio"].fillna(0), width=0.4,
         label="throughput new/base")
  ax.axhline(1.0, color="black", linewidth=0.8)
  ax.set_xticks(list(xs), labels, fontsize=8)
  ax.set_title("Baseline vs new (ratios)")
  ax.legend(fontsize=7)
  return _png(fig)


def _bench_plot(bench):
  """Per workload and framework: ours / peer, the median with its min-max over the rounds, and
  the model-FLOP ratio beside it; the line at 1.0 is parity."""
  rows = bench[bench["ratio_median"].notna()]
  fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(rows)), 3.2))
  xs = list(range(len(rows)))
  median = rows["ratio_median"]
  ax.bar([x - 0.2 for x in xs], median, width=0.4, label="samples/s ours / peer",
         yerr=[median - rows["ratio_min"], rows["ratio_max"] - median], capsize=3)
  ax.bar([x + 0.2 for x in xs], rows["model_flop_ratio"].fillna(0), width=0.4,
         label="model-FLOP rate ours / peer")
  ax.axhline(1.0, color="black", linewidth=0.8)
  ax.set_xticks(xs, [f"{w}\n{f}" for w, f in zip(rows["workload"], rows["framework"])],
                fontsize=7)
  ax.set_title("Training step against the peer (median, min-max over interleaved rounds)")
  ax.legend(fontsize=7)
  return _png(fig)


def _bench_section(path):
  bench = bench_table.read(path)
  parts = [f"<h2 id='bench'>Throughput against peers</h2><p>From {html.escape(path)} "
           "(bench/all.py)</p>"]
  if bench["ratio_median"].notna().any():
    parts.append(_img(_bench_plot(bench), "ours against the peers"))
  return parts + [_table(bench, value_columns=bench_table.NUMBERS)]


def _changes_table(changes, history) -> str:
  """A workload's change points (or that there were none), with what was tested."""
  what = html.escape(changepoints.describe(history))
  if changes.empty:
    return f"<p class='changepoints'>No change point. {what}.</p>"
  shown = changes.assign(first_seen=changes["first_seen"].dt.strftime("%Y-%m-%d %H:%M"))
  return (f"<p class='changepoints'>Change points: {what}.</p>"
          + _table(shown, value_columns=("before", "after", "change", "p")))


def _table(frame, value_columns=()):
  """An HTML table; numeric cells in value_columns carry their exact value in data-value."""
  head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
  rows = []
  for _, row in frame.iterrows():
    cells = []
    for column in frame.columns:
      value = row[column]
      if column in value_columns and isinstance(value, float) and pd.notna(value):
        cells.append(f'<td class="{column}" data-value="{value!r}">{value:.4f}</td>')
      else:
        cells.append(f"<td>{'' if pd.isna(value) else html.escape(str(value))}</td>")
    rows.append("<tr>" + "".join(cells) + "</tr>")
  return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def render(csv_paths: list[str], baseline: str | None = None, threshold: float = 0.05,
           bench: str | None = None) -> str:
  """The page's HTML: the result CSVs' sections, then the bench table's (either may be absent)."""
  parts = _results_sections(csv_paths, baseline, threshold) if csv_paths else []
  if bench:
    parts += _bench_section(bench)
  style = ("body{font-family:sans-serif;max-width:1000px;margin:auto}table{border-collapse:"
           "collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}")
  sources = ", ".join(html.escape(p) for p in csv_paths + ([bench] if bench else []))
  return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Benchmark report</title>"
          f"<style>{style}</style></head><body><h1>Benchmark report</h1><p>From {sources}</p>"
          + "\n".join(parts) + "</body></html>")


def _results_sections(csv_paths, baseline, threshold) -> list:
  frames = []
  for path in csv_paths:
    frame = results.read_csv(path)
    frames.append(frame.assign(_csv=path))
  frame = pd.concat(frames, ignore_index=True)
  timed = frame[frame["preset"] != "synthetic"]
  csv_of = dict(zip(frame["run_id"], frame["_csv"]))
  summary = summarize.summarize(csv_paths)
  scores = {(r.system, r.benchmark, r.framework, r.preset): r.score_min
            for r in summary.itertuples()}
  parts = ["<h2>Summary (MLPerf olympic scores, minutes)</h2>",
           _table(summary, value_columns=("score_min",))]
  history = changepoints.analyse(frame)
  for workload, rows in frame.groupby("workload", sort=True):   # one section per workload
    name = html.escape(str(workload))
    parts.append(f"<h2 id='{name}'>{name}</h2>")
    timed_rows = timed[timed["workload"] == workload]
    if len(timed_rows):
      parts += ["<h3>Eval metric per run</h3>",
                _img(_curves_plot(timed_rows, csv_of), f"{name} eval curves"),
                "<h3>Time to train</h3>",
                _img(_ttt_plot(timed_rows, scores), f"{name} time to train")]
    mine = history.changes[history.changes["workload"] == workload]
    parts += ["<h3>History</h3>", _img(_history_plot(rows, mine), f"{name} history"),
              _changes_table(mine, history)]
  if baseline:
    table = compare.compare(baseline, csv_paths[-1], threshold)
    verdict = "REGRESSION" if compare.is_regression(table) else "no regression"
    parts += [f"<h2>Baseline vs new: {verdict}</h2>",
              f"<p>baseline {html.escape(baseline)}, new {html.escape(csv_paths[-1])}, "
              f"threshold {threshold:.0%}</p>",
              _table(table, value_columns=("ttt_ratio", "throughput_ratio")),
              _img(_compare_plot(table), "baseline vs new")]
  runs = frame[["run_id", "started_at", "workload", "framework", "preset", "status",
                "time_to_train_s", "throughput", "git_commit"]]
  parts += ["<h2>Runs</h2>", _table(runs)]
  return parts


def write(csv_paths, out_dir, baseline=None, threshold=0.05, bench=None) -> str:
  if not csv_paths and not bench:
    raise UsageError("report: no input; allowed: result CSVs, --bench FILE, or both")
  if baseline and not csv_paths:
    raise UsageError("--baseline needs a result CSV to compare against it")
  for path in csv_paths + ([baseline] if baseline else []):
    if not os.path.isfile(path):
      raise UsageError(f"{path!r}: no such result CSV")
  if bench and not os.path.isfile(bench):
    raise UsageError(f"--bench {bench!r}: no such file")
  page = render(csv_paths, baseline, threshold, bench)   # all reading before anything is written
  try:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "index.html")
    with open(path, "w") as f:
      f.write(page)
  except OSError as e:
    raise UsageError(f"--out {out_dir!r} cannot be written ({e.strerror})") from None
  return path
