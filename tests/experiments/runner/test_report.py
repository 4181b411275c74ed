"""The terminal report (`experiments/runner/report.py`): a step's metrics over its minibatches, the progress
line, the closing table."""

from experiments.runner import report


def test_combine_keeps_extremes():
  assert report.combine("ratio_min", [0.5, 0.2]) == 0.2 and report.combine("ratio_max", [0.5, 0.2]) == 0.5
  assert report.combine("loss", [1.0, 2.0]) == 1.5


def test_mismatch_metrics_come_from_the_first_minibatch_and_show_when_large():
  assert report.combine("mismatch_logp_diff_max", [0.1, 0.7]) == 0.1
  assert report.combine("mismatch_kl", [2.0, 1.0]) == 2.0
  small = {"train/loss": 0.5, "train/mismatch_kl": 1e-6, "train/mismatch_ratio_outside": 0.0}
  assert report.progress_line(small) == "loss 0.5000"
  large = {**small, "train/mismatch_kl": 2e-3}
  assert report.progress_line(large) == "loss 0.5000 mismatch kl 2.0e-03 out 0.00%"
  outside = {**small, "train/mismatch_ratio_outside": 0.004}
  assert report.progress_line(outside) == "loss 0.5000 mismatch kl 1.0e-06 out 0.40%"


def test_progress_line_skips_missing_and_non_finite_values():
  values = {"train/reward_mean": 0.25, "train/accuracy": float("nan"), "train/kl": 0.0123456, "train/note": "x"}
  assert report.progress_line(values) == "reward 0.250 kl 0.0123"


def test_print_table(capsys):
  report.print_table("summary", [("a", "1"), ("longer", "2.5%")])
  assert capsys.readouterr().out == "\nsummary\n" + "-" * 16 + "\na       1\nlonger  2.5%\n"
