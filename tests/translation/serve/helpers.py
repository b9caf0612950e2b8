"""What the server's tests share: toy checkpoints, the server started as a user starts it (a
subprocess on a free loopback port), and a plain HTTP client (the standard library's)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch

from common.checkpoint_fields import inference_fields
from data.tokenizer import SubwordTokenizer
from fastpaths.optimize import optimize
from tests.toy_text import toy_pairs, train_word_spm
from tests.transformer.helpers import tiny_model
from translation.checkpoint import write_checkpoint
from translation.translator import Translator

ROOT = Path(__file__).resolve().parents[3]
TAGS = {"de": "<2de>", "fr": "<2fr>"}
INSTALL = 'the serve extra is not installed (python3 -m pip install -e ".[serve]")'
REQUIRE_SERVE = "NMT_REQUIRE_SERVE"


def require_serve() -> None:
    """Skips the calling module without Starlette or uvicorn, saying what to install; where
    ``NMT_REQUIRE_SERVE`` is set (CI) their absence is an error instead, so that CI cannot pass
    without having run the server's tests."""
    for package in ("starlette", "uvicorn"):
        if os.environ.get(REQUIRE_SERVE):
            __import__(package)
        else:
            pytest.importorskip(package, reason=INSTALL)


def write_toy_checkpoint(path: Path, tags: dict[str, str] | None = None) -> Path:
    """A random tiny model of the toy task (de->en; with ``tags``, en->{de,fr}, its vocabulary
    holding them), written as training writes it."""
    pairs = toy_pairs(50, seed=0)
    src = SubwordTokenizer(
        train_word_spm([s for s, _ in pairs] + ([" ".join(tags.values())] if tags else []))
    )
    tgt = SubwordTokenizer(train_word_spm([t for _, t in pairs]))
    torch.manual_seed(0)
    model = tiny_model(src_vocab_size=src.vocab_size, tgt_vocab_size=tgt.vocab_size, max_positions=24)
    langs = ("en", "de") if tags else ("de", "en")
    return write_checkpoint(path, model, inference_fields(src.model_proto, tgt.model_proto, *langs, tags))


def reference_translator(checkpoint: Path, target_lang: str | None = None) -> Translator:
    """The Python API's translator of ``checkpoint`` with the CPU's fast paths, as the server has."""
    translator = Translator.from_checkpoint(checkpoint, target_lang=target_lang)
    translator.use(optimize(translator.model, translator.device, "inference"))
    return translator


class Server:
    """``python3 -m translation.serve --checkpoint CKPT --port 0 OPTIONS`` in a subprocess, its
    stderr in ``log_path``; :meth:`start` returns once it says where it listens."""

    def __init__(self, checkpoint: Path, log_path: Path, *options: str) -> None:
        self.command = [
            sys.executable,
            "-m",
            "translation.serve",
            "--checkpoint",
            str(checkpoint),
            "--port",
            "0",
            "--threads",
            "1",
            *options,
        ]
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, timeout: float = 120.0) -> Server:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command, cwd=ROOT, env=env, stderr=log, stdout=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(r"listening on (http://\S+)", self.log())
            if found:
                self.url = found.group(1).rstrip("/")
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.05)
        self.stop(signal.SIGKILL)
        raise AssertionError(f"the server did not listen within {timeout} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Sends ``sig`` and waits: the exit status (killed if it outlives ``timeout``)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the server did not stop within {timeout} s:\n{self.log()}") from None

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop()

    def post(self, body: Any, path: str = "/translate", timeout: float = 120.0) -> tuple[int, dict, dict]:
        """POSTs ``body`` (JSON-encoded unless bytes): status, the JSON answer, the headers."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.loads(response.read()), dict(response.headers)
        except urllib.error.HTTPError as err:
            with err:
                return err.code, json.loads(err.read()), dict(err.headers)

    def get(self, path: str, timeout: float = 60.0) -> tuple[int, str, dict]:
        """GETs ``path``: status, the body as text, the headers."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
                return response.status, response.read().decode(), dict(response.headers)
        except urllib.error.HTTPError as err:
            with err:
                return err.code, err.read().decode(), dict(err.headers)

    def health(self) -> dict:
        status, text, _ = self.get("/health")
        assert status == 200, text
        return json.loads(text)
