"""Two CPU ranks (gloo) started at once, as torchrun starts them: one preparation, one vocabulary."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # two Python processes importing Lightning: ~30 s on a loaded 2-core machine
def test_two_ranks_prepare_once_and_share_the_vocabulary(tiny_corpus_dir: Path, tmp_path: Path) -> None:
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            NODE_RANK="0",
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            PYTHONPATH=str(ROOT),
            OMP_NUM_THREADS="1",
        )
        args = [str(tiny_corpus_dir), str(tmp_path / "cache"), str(tmp_path / f"rank{rank}.json")]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.data.ddp_prepare_worker", *args],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    for proc in procs:
        output, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, output[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world_size"] for r in ranks} == {2}

    totals = {key: sum(r["counts"][key] for r in ranks) for key in ranks[0]["counts"]}
    assert totals["corpus_splits_written"] == 3  # train, validation, test: once, by one rank
    assert totals["sentencepiece_trained"] == 1
    # Each split encoded once, source and target, in one batch (entries are locked one by one, so
    # the ranks may share the work; 2 calls per split when done twice).
    assert totals["encode_calls"] == 2 * 3
    assert ranks[0]["fingerprint"] == ranks[1]["fingerprint"]  # the same vocabulary everywhere
    assert ranks[0]["vocab_size"] == ranks[1]["vocab_size"] == 64
    # Each rank trained on its own share of the one prepared corpus: disjoint, together all.
    assert not set(ranks[0]["ids"]) & set(ranks[1]["ids"])
    assert sorted(ranks[0]["ids"] + ranks[1]["ids"]) == list(range(400))
