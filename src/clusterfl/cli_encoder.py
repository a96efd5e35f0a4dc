"""`clusterfl encoder ...`: pretrain FLT's ConvAE encoder and inspect encoder files.

    clusterfl encoder train --source fashion_mnist --epochs 30 [--out PATH] [--data-dir DIR]
                            [--latent 128] [--seed 0] [--batch-size 64] [--lr 0.001]
                            [--max-samples N]
    clusterfl encoder show PATH

`train` fits the ConvAE of FLT App. C.3 without labels on the training images of `--source`
and writes an encoder file (flat parameters, model config, source dataset, SHA-256). Without
`--out` the file goes to the cache FLT reads (`<data dir>/encoders/conv_ae-<source>-l<latent>-
e<epochs>-s<seed>.pt`, the data folder being `--data-dir`, else `$CLUSTERFL_DATA`, else
~/.cache/clusterfl: the folder a run with the same data folder reads), so `[algorithm] encoder =
"<source>"` with the same `pretrain_epochs` and `encoder_seed` reuses it; with `--out`, point
`encoder` at the file. A cache folder that cannot be written (or is read-only) is refused
before any training: give `--out`. So is a `--latent` whose training would not fit in the
machine's memory (once the dataset is read; nothing is allocated for the model).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the `encoder` subcommand (with `train` and `show`) on argparse subparsers."""
    p = subparsers.add_parser(
        "encoder", help="pretrain or inspect FLT's ConvAE encoder",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    sub = p.add_subparsers(dest="encoder_command", required=True)
    t = sub.add_parser("train", help="pretrain a ConvAE without labels and save it")
    t.add_argument("--source", required=True, help="dataset to train on, e.g. fashion_mnist")
    t.add_argument("--epochs", type=int, default=30, help="passes over the data (default 30)")
    t.add_argument("--out", help="encoder file to write (default: the FLT encoder cache)")
    t.add_argument("--data-dir", help="dataset folder (default: $CLUSTERFL_DATA or cache)")
    t.add_argument("--latent", type=int, default=128, help="code size e (default 128)")
    t.add_argument("--seed", type=int, default=0, help="initialisation and batch order "
                   "(default 0; FLT's encoder_seed)")
    t.add_argument("--batch-size", type=int, default=64, help="default 64")
    t.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default: 0.001)")
    t.add_argument("--max-samples", type=int, help="use only the first N training images")
    t.add_argument("--quiet", action="store_true", help="no per-epoch lines")
    t.set_defaults(func=cmd_train)
    s = sub.add_parser("show", help="print an encoder file's metadata (checks its SHA-256)")
    s.add_argument("path", help="an encoder file (.pt)")
    s.set_defaults(func=cmd_show)
    return p


def _check(args: argparse.Namespace) -> None:
    from clusterfl.errors import ConfigError

    for name in ("epochs", "latent", "batch_size"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}", "must be ≥ 1")
    if not 0 < args.lr < float("inf"):  # nan and inf too
        raise ConfigError("--lr", f"must be a finite number > 0, got {args.lr}")
    if args.max_samples is not None and args.max_samples < 1:
        raise ConfigError("--max-samples", "must be ≥ 1")


def _check_out(path: Path) -> None:
    """Before any training: `--out` must be a new file or an encoder file (replaced), in a
    folder that exists or can be made; anything else there is never overwritten."""
    from clusterfl import encoders
    from clusterfl.errors import ClusterFLError, ConfigError

    if path.is_dir():
        raise ConfigError("--out", f"{path} is a folder; give the encoder file's path")
    if path.exists():
        try:
            encoders.load(path)
        except ClusterFLError:
            raise ConfigError("--out", f"{path} exists and is not an encoder file; it is not "
                              "overwritten: choose another path") from None
    above = next((p for p in path.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ConfigError("--out", f"{above} is a file, not a folder: {path} cannot be made")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("--out", f"cannot create the folder of {path} "
                          f"({exc.strerror or exc})") from None


def _warn_unnamed_settings(args: argparse.Namespace) -> None:
    """One warning line when an encoder with settings its cache name does not hold (the name
    says source, latent, epochs and seed) goes into the cache: a run naming the dataset would
    load it as the encoder it pretrains by default."""
    odd = [f"--{k.replace('_', '-')} {v:g}" for k, v, default in (
        ("max_samples", args.max_samples, None), ("batch_size", args.batch_size, 64),
        ("lr", args.lr, 1e-3)) if v != default]
    if odd:
        print(f"clusterfl: warning: {', '.join(odd)} is not in the cache name: an FLT run with "
              f"encoder = {args.source!r} (latent {args.latent}, pretrain_epochs "
              f"{args.epochs}, encoder_seed {args.seed}) will load this encoder as its "
              "default one; write a variant elsewhere with --out", file=sys.stderr)


def cmd_train(args: argparse.Namespace) -> int:
    """Pretrain and save; prints the file, its checksum and the final loss."""
    from clusterfl import encoders

    _check(args)
    path = Path(args.out).expanduser() if args.out else encoders.cached_path(
        args.source, args.latent, args.epochs, args.seed,
        encoders.default_encoder_dir(args.data_dir))
    if args.out:
        _check_out(path)
    else:  # the cache in the data folder: writable, or the way out before any training
        encoders.check_cache_folder(path.parent, "--out", "write it elsewhere with --out "
                                    "PATH (and set algorithm.encoder = PATH in the run)")
        _warn_unnamed_settings(args)
    t0 = time.perf_counter()

    def report(epoch: int, loss: float) -> None:
        if not args.quiet:
            print(f"epoch {epoch}/{args.epochs}  reconstruction loss {loss:.4f}", flush=True)

    def make() -> encoders.EncoderFile:
        made = encoders.pretrain(args.source, args.epochs, args.latent, args.seed,
                                 args.data_dir, args.batch_size, args.lr, args.max_samples,
                                 report, latent_field="--latent")
        encoders.save(made, path)
        return made

    if args.out:
        enc = make()
    else:  # the cache a run reads: pretrained once, as a run does (encoders.pretrain_once)
        got = encoders.pretrain_once(path, make, replace=True)
        if got is None:
            enc = encoders.load(path)
            print(f"{path} was pretrained meanwhile by another process ("
                  f"{enc.params.numel()} parameters, sha256 {enc.sha256}); not trained again")
            return 0
        enc = got
    print(f"wrote {path} ({enc.params.numel()} parameters, sha256 {enc.sha256}) in "
          f"{time.perf_counter() - t0:.0f} s")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """Print the metadata of an encoder file as JSON."""
    from clusterfl import encoders

    print(json.dumps(encoders.describe(encoders.load(args.path)), indent=2))
    return 0


__all__ = ["add_parser", "cmd_show", "cmd_train"]
