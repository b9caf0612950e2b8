"""bench/attention_translation.py: which runs it makes, what it reads back, and one tiny run end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.attention_translation import configurations, logged_training, main
from data.corpus import DATA_DIR_ENV, shared_data_dir
from transformer.mechanisms import REFUSED, AttentionConfig

# The bench tier: runs a benchmark script end to end (python3 -m pytest -m slow; README, "Test").
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MULTI30K = Path(os.environ.get(DATA_DIR_ENV) or shared_data_dir())


def test_every_mechanism_in_every_self_attention_role_it_can_take_and_one_baseline():
    runs = configurations()
    labels = [label for label, _, _ in runs]
    assert labels[0] == "softmax" and len(set(labels)) == len(labels)
    for role in ("encoder_self", "decoder_self"):
        expected = {name for name, refused in REFUSED.items() if name != "softmax" and role not in refused}
        assert {m for _, r, m in runs if r == role} == expected
        for name in expected:  # every configuration is one the model accepts
            AttentionConfig(**{role: name})
    # Linformer and Nystrom are not causal: encoder only. Every other one takes both roles.
    assert "encoder_self=linformer" in labels and "decoder_self=linformer" not in labels
    assert "encoder_self=nystrom" in labels and "decoder_self=nystrom" not in labels
    assert "decoder_self=linear" in labels and "decoder_self=lsh" in labels


def test_dry_run_changes_only_the_mechanism_and_refuses_unknown_labels(capsys):
    assert main(["--dry-run", "--runs-dir", "/tmp/x", "--only", "softmax", "decoder_self=performer"]) == 0
    softmax, performer = capsys.readouterr().out.strip().splitlines()
    assert performer.endswith(" model.attention.decoder_self=performer")
    assert "model.attention" not in softmax
    same = lambda line: [a for a in line.split() if not a.startswith(("hydra.run.dir", "model.attention"))]  # noqa: E731
    assert same(softmax) == same(performer)
    assert "trainer.max_time=00:00:05:00" in softmax and "test_ckpt=averaged" in softmax
    with pytest.raises(SystemExit):
        main(["--dry-run", "--only", "cross=local"])
    assert "unknown configuration(s) cross=local" in capsys.readouterr().err


def test_logged_training_reads_validations_updates_and_mean_tokens_per_second(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "metrics.csv").write_text(
        "epoch,step,train/tok_s,val/loss\n"
        "0,19,1000.0,\n"  # the first logged value: warm-up, left out
        "0,39,3000.0,\n"
        "0,40,,2.5\n"
        "1,59,5000.0,\n"
        "1,69,,2.0\n"
    )
    (tmp_path / "train.log").write_text(
        "[..][training.pipeline][INFO] - run stopped early at update 70: ...\n"
    )
    assert logged_training(tmp_path) == {"epochs": 2, "updates": 70, "tok_s": 4000.0}


@pytest.mark.realdata
@pytest.mark.skipif(
    not (MULTI30K / "train.de.gz").is_file(),
    reason=f"Multi30k not found in {MULTI30K} (set $MULTI30K_DIR)",
)
def test_one_tiny_run_end_to_end(tmp_path):
    out = tmp_path / "results.json"
    args = ["--experiment", "smoke", "--budget", "00:00:01:00", "--warmup", "5", "--average-last", "1"]
    args += ["--only", "decoder_self=linear", "--runs-dir", str(tmp_path / "runs"), "--json", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "attention_translation.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (record,) = json.loads(out.read_text())["results"]
    assert record["status"] == "ok" and record["mechanism"] == "linear" and record["role"] == "decoder_self"
    assert record["epochs"] == 1 and record["updates"] == 20 and record["peak_rss_mib"] > 100
    assert 0 <= record["bleu"] <= 100 and 0 <= record["chrf"] <= 100
    assert "| decoder_self=linear " in proc.stdout
    config = (tmp_path / "runs" / "decoder_self-linear" / "config.yaml").read_text()
    assert "decoder_self: linear" in config
