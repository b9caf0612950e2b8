"""``python3 -m translation.serve``: a checkpoint's translations over HTTP.

    python3 -m translation.serve --checkpoint runs/x/checkpoints/averaged.ckpt --port 8080
    curl -s localhost:8080/translate -d '{"lines": ["Ein Hund rennt."], "beam_size": 5}'

Loads the checkpoint once, applies the device's fast paths as ``translate.py`` does, and serves
``POST /translate``, ``GET /`` (a page to type into) and ``GET /health`` (``app.py``) with
uvicorn, requests gathered into searches by one decoding thread (``batcher.py``). It logs
``listening on http://HOST:PORT/`` on stderr once it answers (``--port 0`` takes a free port,
which that line names). SIGTERM or Ctrl-C stops it cleanly: it takes no new connections,
answers the requests in flight, lets the decoder finish, and exits with status 0. A bad
checkpoint or option is a one-line error with status 2, as in ``translate.py``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
from dataclasses import asdict

import torch
import uvicorn

from decoding import DecodingConfig, SearchSettings
from fastpaths.packed import bound_kernel_caches
from translation.checkpoint import CheckpointError
from translation.options import DTYPES
from translation.serve.app import build_app
from translation.serve.batcher import Batcher, BatchLimits
from translation.serve.model import ServedModel
from translation.serve.requests import RequestLimits

PROG = "python3 -m translation.serve"
logger = logging.getLogger("translation.serve")

BEAM_HELP = (
    "a request's beam size where it sets none (default: the checkpoint's, as its test stage searched; "
    f"{DecodingConfig.beam_size} where it does not say); its length penalty and limits are the "
    "checkpoint's too"
)


def build_parser() -> argparse.ArgumentParser:
    """The command line's options; each limit's default is its dataclass's."""
    batch, request = BatchLimits(), RequestLimits()
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="the .ckpt file to translate with")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8080, help="0: a free port (default: %(default)s)")
    parser.add_argument(
        "--target-lang",
        help="for a model of several target languages: the one a request that names none gets",
    )
    parser.add_argument("--beam-size", type=int, default=None, help=BEAM_HELP)
    parser.add_argument(
        "--greedy",
        action="store_true",
        help='greedy search by default (a request\'s "greedy": false asks for the beam)',
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (default: cpu)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="(default: %(default)s)")
    parser.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (default: torch's)")
    parser.add_argument(
        "--max-tokens",
        type=int,
        metavar="N",
        help="a search's batches: sentences * hypotheses * longest source at most N (default: the device's)",
    )
    limits = parser.add_argument_group("limits")
    limits.add_argument(
        "--max-queued-lines",
        type=int,
        default=batch.max_queued_lines,
        metavar="N",
        help="lines waiting for a search at most; a request past it gets 503 (default: %(default)s)",
    )
    limits.add_argument(
        "--max-batch-lines",
        type=int,
        default=batch.max_batch_lines,
        metavar="N",
        help="lines gathered into one search (default: %(default)s)",
    )
    limits.add_argument(
        "--max-batch-tokens",
        type=int,
        default=batch.max_batch_tokens,
        metavar="N",
        help="source subwords gathered into one search (default: %(default)s)",
    )
    limits.add_argument(
        "--max-delay-ms",
        type=float,
        default=batch.max_delay * 1000,
        metavar="MS",
        help="wait up to MS after a request arrives for others to join its search (default: %(default)s)",
    )
    limits.add_argument(
        "--max-request-lines",
        type=int,
        default=request.max_lines,
        metavar="N",
        help="lines in one request; more: 400 (default: %(default)s)",
    )
    limits.add_argument(
        "--max-body-bytes",
        type=int,
        default=request.max_body_bytes,
        metavar="N",
        help="bytes in one request; more: 413 (default: %(default)s)",
    )
    limits.add_argument(
        "--max-beam-size",
        type=int,
        default=request.max_beam_size,
        metavar="N",
        help="the largest beam_size and nbest a request may ask for (default: %(default)s)",
    )
    parser.add_argument("--access-log", action="store_true", help="log every request (uvicorn's access log)")
    return parser


def _limits(args: argparse.Namespace) -> tuple[BatchLimits, RequestLimits]:
    """The options' limits, checked (ValueError names the option)."""
    if args.max_request_lines > args.max_queued_lines:
        raise ValueError(
            f"--max-request-lines {args.max_request_lines} is over --max-queued-lines "
            f"{args.max_queued_lines}: such a request could never be queued"
        )
    batch = BatchLimits(
        args.max_queued_lines, args.max_batch_lines, args.max_batch_tokens, args.max_delay_ms / 1000
    )
    return batch, RequestLimits(args.max_request_lines, args.max_body_bytes, args.max_beam_size)


def request_defaults(search: SearchSettings, beam_size: int | None, greedy: bool) -> DecodingConfig:
    """A request's search where it sets none: the checkpoint's ``search`` (its test stage's), with
    ``--beam-size`` (None: the checkpoint's) and ``--greedy`` over it.

    Raises:
        ValueError: a beam size :class:`DecodingConfig` refuses.
    """
    chosen = search.beam_size if beam_size is None else beam_size
    return DecodingConfig(**{**asdict(search), "beam_size": chosen}, greedy=greedy)


def serve(args: argparse.Namespace) -> None:
    """Loads the model, listens and serves until SIGTERM or SIGINT."""
    bound_kernel_caches()  # as translate.py does, before the first matmul (fastpaths/packed.py)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    batch_limits, request_limits = _limits(args)
    model = ServedModel.load(
        args.checkpoint, args.device, DTYPES[args.dtype], args.target_lang, max_tokens=args.max_tokens
    )
    defaults = request_defaults(model.search, args.beam_size, args.greedy)
    logger.info(
        "loaded %s: %s -> %s, %d parameters, on %s in %s",
        args.checkpoint,
        model.src_lang or "?",
        ", ".join(model.languages) or "?",
        model.model.num_parameters(),
        next(model.model.parameters()).device,
        args.dtype,
    )
    batcher = Batcher(model.decode, batch_limits)
    sock = socket.create_server((args.host, args.port))  # bound here: --port 0 learns its port
    host, port = sock.getsockname()[:2]
    url = f"http://{host}:{port}/" if ":" not in host else f"http://[{host}]:{port}/"
    app = build_app(
        model, batcher, defaults, request_limits, on_start=lambda: logger.info("listening on %s", url)
    )
    config = uvicorn.Config(
        app, log_config=None, access_log=args.access_log, timeout_graceful_shutdown=60, lifespan="on"
    )
    # uvicorn shuts down gracefully on SIGTERM and SIGINT, then raises the signal again to the
    # handler it found: this one, so that a clean stop exits with status 0.
    stops: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, frame: stops.append(number))
    uvicorn.Server(config).run(sockets=[sock])
    if stops:
        logger.info("stopped by %s", signal.Signals(stops[0]).name)


def main(argv: list[str] | None = None) -> int:
    """Runs the server; returns the exit status (0, or 2 for a one-line error)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s", stream=sys.stderr)
    try:
        serve(args)
    except (CheckpointError, ValueError, OSError) as err:
        what = "checkpoint " if isinstance(err, CheckpointError) else ""
        message = " ".join(str(err).split("\n"))
        sys.stderr.write(f"{PROG}: error: {what}{message}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
