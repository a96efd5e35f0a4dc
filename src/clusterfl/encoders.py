"""Pretrained ConvAE encoders for FLT (Jamali-Rad et al. 2022, §4.1 "Enc1/Enc2", App. C.3).

FLT's server hands every client an encoder G(·) trained without labels on some dataset:
"Enc1" on the task's own domain, "Enc2" on a different one (Fashion-MNIST for MNIST tasks and
the reverse), which clients then fine-tune for F epochs. This module pretrains such a ConvAE
(the zoo's `conv_ae`, 51,577 parameters for 28×28 images with a 128-d code), saves it, and
loads it back, checking its integrity.

An encoder file (`torch.save` of a plain dict) holds:
- `params`: the flat float32 parameters of the whole autoencoder (the decoder is needed for
  fine-tuning), `sha256`: the SHA-256 of their bytes (checked on load);
- `model`: the model config (`{"name": "conv_ae", "latent": 128}`), `input_shape`;
- `source`, `epochs`, `seed`, `batch_size`, `lr`, `losses` (mean loss per epoch), `format`.

Pretraining choices (the paper gives none; the authors' code trains 30 epochs with Adam at
lr 1e-3 and binary cross-entropy): Adam, lr 1e-3, minibatch 64, binary cross-entropy of the
sigmoid reconstruction, on the source's training split, constant learning rate.

Default location: `<data dir>/encoders/conv_ae-<source>-l<latent>-e<epochs>-s<seed>.pt`, where the
data dir is the folder the pretraining dataset is read from: the `data_dir` given (FLT gives
`algorithm.data_dir`, else the run's data folder, `data.data_dir` or `--data-dir`), else
`$CLUSTERFL_DATA`, else `~/.cache/clusterfl` (`clusterfl.data.catalog.resolve_data_dir`),
unless an encoder folder is given. Before minutes of pretraining, the folder the encoder will
be saved in is checked: one that cannot be made or written (or a read-only one: no write
permission bit, even for root) is a one-line ConfigError naming the setting that moves it
(`algorithm.encoder_dir`).
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clusterfl.config_util import physical_memory_bytes
from clusterfl.data.catalog import resolve_data_dir
from clusterfl.data.sources import Source, load_source
from clusterfl.engine.signatures import build_conv_ae, train_autoencoder
from clusterfl.errors import ConfigError, DataError
from clusterfl.models.params import get_flat

FORMAT = 1
RANDOM = "none"  # encoder spec meaning "an untrained, seeded ConvAE" (only for experiments)


@dataclass
class EncoderFile:
    """A pretrained ConvAE: flat parameters plus what is needed to rebuild and audit it."""

    params: torch.Tensor
    latent: int
    input_shape: tuple[int, ...]
    source: str
    epochs: int
    seed: int
    batch_size: int = 64
    lr: float = 1e-3
    losses: list[float] = field(default_factory=list)

    @property
    def sha256(self) -> str:
        return params_sha256(self.params)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "params": self.params.detach().to(torch.float32).clone(),
            "sha256": self.sha256, "model": {"name": "conv_ae", "latent": self.latent},
            "input_shape": list(self.input_shape), "source": self.source,
            "epochs": self.epochs, "seed": self.seed, "batch_size": self.batch_size,
            "lr": self.lr, "losses": list(self.losses),
        }


def params_sha256(params: torch.Tensor) -> str:
    """SHA-256 of the float32 little-endian bytes of the flat parameters."""
    arr = params.detach().to(torch.float32).contiguous().numpy().astype("<f4")
    return hashlib.sha256(arr.tobytes()).hexdigest()


def default_encoder_dir(data_dir: str | Path | None = None) -> Path:
    """`<data dir>/encoders`; the data dir as `load_source` finds it (the argument, else
    `$CLUSTERFL_DATA`, else `~/.cache/clusterfl`: `resolve_data_dir`)."""
    return resolve_data_dir(data_dir)[0] / "encoders"


def check_cache_folder(folder: str | Path, field_name: str, fix: str) -> None:
    """Raise a one-line ConfigError naming `field_name` (`fix`: what to do) unless `folder`
    exists as a writable folder or can be made in one. Nothing is created.

    A folder without any write permission bit counts as read-only even where the process
    could write it anyway (root): a data folder marked read-only is not written into.
    """
    folder = Path(folder).expanduser()
    above = next((p for p in (folder, *folder.parents) if p.exists()), None)
    why = None
    if above is None:
        why = "none of its folders exists"
    elif not above.is_dir():
        why = f"{above} is a file, not a folder"
    else:
        mode = stat.S_IMODE(above.stat().st_mode)
        if not mode & 0o222 or not os.access(above, os.W_OK | os.X_OK):
            why = f"{above} is read-only"
    if why is not None:
        raise ConfigError(field_name, f"the encoder cache {folder} cannot be written ({why}): "
                                      f"{fix}")


def conv_ae_size(input_shape: tuple[int, ...], latent: int) -> int:
    """The parameters of the ConvAE for `input_shape` and `latent`, counted without memory
    (on the meta device; no random numbers drawn)."""
    with torch.device("meta"):
        model = build_conv_ae(tuple(input_shape), latent)
    return sum(p.numel() for p in model.parameters())


def check_fits_in_memory(input_shape: tuple[int, ...], latent: int, field_name: str) -> None:
    """Refuse, before anything is allocated, a ConvAE whose training needs more than the
    machine's physical memory: its parameters, gradients and Adam's two moments, 4 float32
    copies (`--latent 100000000` ran until the system killed it). Shapes the ConvAE cannot
    take are left to the caller's own message."""
    have = physical_memory_bytes()
    try:
        d = conv_ae_size(input_shape, latent)
    except (ValueError, RuntimeError):
        return
    need = 16 * d
    if have is not None and need > have:
        raise ConfigError(field_name, f"{latent:,} gives a ConvAE of {d:,} parameters for "
                          f"inputs {tuple(input_shape)}; training it holds 4 float32 copies "
                          f"(parameters, gradients, Adam's two moments), {need / 2**30:,.1f} GiB, "
                          f"more than this machine's {have / 2**30:,.1f} GiB of memory: choose "
                          "a smaller latent (default 128)")


def cached_path(source: str, latent: int, epochs: int, seed: int,
                encoder_dir: str | Path | None = None) -> Path:
    """Where the encoder pretrained with these settings is cached."""
    folder = Path(encoder_dir).expanduser() if encoder_dir is not None else default_encoder_dir()
    return folder / f"conv_ae-{source}-l{latent}-e{epochs}-s{seed}.pt"


def pretrain(source: str, epochs: int, latent: int = 128, seed: int = 0,
             data_dir: str | Path | None = None, batch_size: int = 64, lr: float = 1e-3,
             max_samples: int | None = None,
             on_epoch: Callable[[int, float], None] | None = None,
             loaded: Source | None = None, latent_field: str = "latent") -> EncoderFile:
    """Train a ConvAE on the training images of dataset `source` (labels unused).

    Args:
        source: a dataset name of `clusterfl.data.sources` (e.g. "fashion_mnist").
        epochs: passes over the data (≥ 1).
        latent: code size e.
        seed: initialisation and batch order.
        data_dir: where the dataset lives (default `$CLUSTERFL_DATA` or the cache).
        max_samples: use only the first this many training images (quick runs).
        on_epoch: called with (epoch, mean loss) after each epoch (progress).
        loaded: `source` already read (`resolve` checks it first), so it is not read again.
        latent_field: the setting named when `latent` would not fit in memory.
    """
    if epochs < 1:
        raise ConfigError("epochs", f"must be ≥ 1, got {epochs}")
    src = loaded if loaded is not None else load_source(source, data_dir)
    if src.task != "classification" or src.x_train.dim() != 4:
        raise ConfigError("source", f"{source!r} is not an image dataset")
    x = src.x_train if max_samples is None else src.x_train[:max_samples]
    check_fits_in_memory(tuple(x.shape[1:]), latent, latent_field)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = build_conv_ae(tuple(x.shape[1:]), latent)
        except ValueError as exc:
            raise ConfigError("source", str(exc)) from None
        losses: list[float] = []
        for epoch in range(epochs):
            losses += train_autoencoder(model, x, 1, lr, batch_size, seed * 7919 + epoch)
            if on_epoch is not None:
                on_epoch(epoch + 1, losses[-1])
    return EncoderFile(get_flat(model), latent, tuple(x.shape[1:]), source, epochs, seed,
                       batch_size, lr, losses)


def save(encoder: EncoderFile, path: str | Path) -> Path:
    """Write the encoder file atomically; returns its path."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    torch.save(encoder.to_dict(), tmp)
    os.replace(tmp, path)
    return path


LOCK_POLL_S = 0.5  # how often a run waiting for another's pretraining looks again


def lock_path(path: str | Path) -> Path:
    """The lock file beside the cache entry `path` while a process pretrains it."""
    path = Path(path)
    return path.with_name(path.name + ".lock")


def _wait() -> None:
    """A run waiting for another's pretraining looks again after `LOCK_POLL_S`."""
    time.sleep(LOCK_POLL_S)


def pretrain_once(path: str | Path, make: Callable[[], EncoderFile],
                  say: Callable[[str], None] | None = None,
                  replace: bool = False) -> EncoderFile | None:
    """Run `make` (pretrain and save to `path`) unless another process is doing it: one run
    holds `<path>.lock` (`rundir.FileLock`: an flock the kernel releases when its holder
    dies, so a lock left by a killed run is taken over) while it pretrains; the others say
    for whom they wait, wait for the lock, and return None if the holder wrote `path` (the
    caller reads it), else pretrain themselves. `replace`: a `path` that was there before is
    trained again (unless another process wrote it while this one waited). Raises OSError
    when the lock cannot be created (a folder that cannot be written)."""
    from clusterfl.files import FileLock

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tell = say if say is not None else (lambda line: print(line, file=sys.stderr, flush=True))
    lock, waited = FileLock(lock_path(path)), False
    while (holder := lock.try_acquire()) is not None:
        if not waited:
            tell(f"encoder cache: waiting for {holder}, which is pretraining {path.name} "
                 f"(lock {lock.path})")
            waited = True
        _wait()
    try:
        if path.is_file() and (waited or not replace):  # finished by another
            return None
        return make()
    finally:
        lock.release()


def load(path: str | Path) -> EncoderFile:
    """Read an encoder file; raises DataError when missing, malformed or corrupted."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise DataError(f"{path} is a folder; give an encoder file (.pt)")
    if not path.is_file():
        raise DataError(f"encoder file not found: {path}. Create one with "
                        "`clusterfl encoder train --source fashion_mnist --out PATH`.")
    try:
        raw = torch.load(path, weights_only=True)
        params = raw["params"]
        enc = EncoderFile(params, int(raw["model"]["latent"]), tuple(raw["input_shape"]),
                          str(raw["source"]), int(raw["epochs"]), int(raw["seed"]),
                          int(raw.get("batch_size", 64)), float(raw.get("lr", 1e-3)),
                          [float(v) for v in raw.get("losses", [])])
        expected = str(raw["sha256"])
    except Exception as exc:  # one line: torch's own message runs over ten
        why = ("not a file torch.save wrote" if not zipfile.is_zipfile(path)
               else f"no {exc} entry" if isinstance(exc, KeyError)
               else "a torch file holding objects an encoder file has not (a checkpoint?)"
               if "Weights only load failed" in str(exc)
               else (str(exc).strip().splitlines() or [type(exc).__name__])[0])
        raise DataError(f"{path} is not a clusterfl encoder file ({why})") from None
    again = "train the encoder again with `clusterfl encoder train`"
    if not isinstance(enc.params, torch.Tensor) or not enc.params.is_floating_point():
        raise DataError(f"{path} is not a clusterfl encoder file (its 'params' entry is not a "
                        "tensor of floats)")
    if enc.sha256 != expected:
        raise DataError(f"{path}: parameter checksum mismatch (file corrupted); {again}")
    try:
        size = conv_ae_size(enc.input_shape, enc.latent)
    except Exception as exc:  # a shape or latent no ConvAE takes
        raise DataError(f"{path} is not a usable encoder file (input shape "
                        f"{enc.input_shape}, latent {enc.latent}: {exc})") from None
    if enc.params.numel() != size:
        raise DataError(f"{path}: {enc.params.numel():,} parameters, but a ConvAE with latent "
                        f"{enc.latent} for inputs {enc.input_shape} has {size:,}; {again}")
    bad = int((~torch.isfinite(enc.params)).sum())
    if bad:
        raise DataError(f"{path}: {bad:,} of its {enc.params.numel():,} parameters are NaN or "
                        f"infinite (every embedding would be); {again}")
    return enc


def resolve(spec: str, input_shape: tuple[int, ...], latent: int, epochs: int, seed: int,
            encoder_dir: str | Path | None = None, data_dir: str | Path | None = None,
            verify: bool = True) -> EncoderFile:
    """The encoder an FLT config names.

    `spec` is a path to an encoder file (anything with a path separator or ending in `.pt`),
    a dataset name (its cached pretrained encoder, trained for `epochs` on first use), or
    "none" (an untrained ConvAE initialised with `seed`). The encoder must fit `input_shape`
    and `latent`, else a ConfigError names `algorithm.encoder`; so does a file that cannot be
    read (corrupted, hand-made) or a cached file whose metadata are not those its name says. A
    `latent` whose ConvAE would not fit in memory is a ConfigError naming `algorithm.latent`,
    before anything is allocated. A dataset is read from `data_dir`
    (`load_source`: else `$CLUSTERFL_DATA`, else the cache) and its encoder cached in
    `encoder_dir` (default `<data dir>/encoders`); a cache that cannot be written is a
    ConfigError naming `algorithm.encoder_dir`, before pretraining. `verify`: check the
    dataset's files against the catalog's checksums (the run's `data.verify`).
    """
    enc = _resolve(spec, input_shape, latent, epochs, seed, encoder_dir, data_dir, train=True,
                   verify=verify)
    assert enc is not None  # trained when missing
    return enc


def check(spec: str, input_shape: tuple[int, ...], latent: int, epochs: int, seed: int,
          encoder_dir: str | Path | None = None, data_dir: str | Path | None = None,
          verify: bool = True) -> None:
    """Everything `resolve` checks (the file, the dataset and their shapes, the cache folder
    it would be saved in), without the minutes of pretraining: a run, or each run of a
    comparison, fails before its first round."""
    _resolve(spec, input_shape, latent, epochs, seed, encoder_dir, data_dir, train=False,
             verify=verify)


def _resolve(spec: str, input_shape: tuple[int, ...], latent: int, epochs: int, seed: int,
             encoder_dir: str | Path | None, data_dir: str | Path | None, train: bool,
             verify: bool = True) -> EncoderFile | None:
    """`resolve`; without `train`, None where it would pretrain."""
    field_name, dir_field, latent_field = ("algorithm.encoder", "algorithm.encoder_dir",
                                           "algorithm.latent")  # the settings it names
    def read(path: str | Path, cache_of: str = "") -> EncoderFile:
        try:
            return load(path)
        except DataError as exc:
            hint = (f" (the cached encoder of {cache_of!r}: delete it and the run pretrains "
                    "it again)" if cache_of else "")
            raise ConfigError(field_name, f"{exc}{hint}") from None

    is_file = spec.endswith(".pt") or os.sep in spec or "/" in spec
    if not is_file:  # the ConvAE is made (or pretrained) here: it must fit first
        check_fits_in_memory(tuple(input_shape), latent, latent_field)
    if spec == RANDOM:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            try:
                model = build_conv_ae(tuple(input_shape), latent)
            except ValueError as exc:
                raise ConfigError(field_name, str(exc)) from None
        return EncoderFile(get_flat(model), latent, tuple(input_shape), RANDOM, 0, seed)
    if is_file:
        enc = read(spec)
    else:
        from clusterfl.data.sources import SOURCE_NAMES

        if spec not in SOURCE_NAMES:
            raise ConfigError(field_name, f"{spec!r} is neither an encoder file (.pt) nor a "
                              f"dataset; allowed datasets: {', '.join(sorted(SOURCE_NAMES))}, "
                              f"or {RANDOM!r}")
        path = cached_path(spec, latent, epochs, seed, encoder_dir or default_encoder_dir(data_dir))
        if path.is_file():
            enc = read(path, spec)
            if (enc.source, enc.epochs, enc.seed) != (spec, epochs, seed):
                raise ConfigError(field_name, f"the cached encoder {path} was pretrained on "
                                  f"{enc.source!r} for {enc.epochs} epochs with seed {enc.seed}, "
                                  f"not on {spec!r} for {epochs} with seed {seed} as its name "
                                  "says: delete it and the run pretrains it again")
        else:  # before minutes of pretraining: the data is there and has the right shape
            try:
                src = load_source(spec, data_dir, verify)
            except DataError as exc:
                raise ConfigError(field_name, f"{spec!r}, the dataset the encoder is "
                                  f"pretrained on, cannot be read: {exc}") from None
            shape = tuple(src.x_train.shape[1:])
            if shape != tuple(input_shape):
                raise ConfigError(field_name, f"{spec!r} has inputs {shape}, this federation "
                                  f"{tuple(input_shape)}: pretrain on a dataset of that shape "
                                  f"(e.g. its own), or give an encoder file or {RANDOM!r}")
            fix = (f"set {dir_field} to a writable folder (the encoder pretrained on {spec!r} "
                   "is cached there" + ("; by default in <data dir>/encoders)"
                                        if not encoder_dir else ")"))
            check_cache_folder(path.parent, dir_field, fix)
            if not train:
                return None

            def make() -> EncoderFile:
                made = pretrain(spec, epochs, latent, seed, data_dir, loaded=src,
                                latent_field=latent_field)
                try:
                    save(made, path)
                except OSError as exc:  # the check passed, the write did not (full, raced)
                    raise ConfigError(dir_field, f"the encoder pretrained on {spec!r} cannot "
                                      f"be saved to {path} ({exc.strerror or exc}): "
                                      f"{fix}") from None
                return made

            try:
                made = pretrain_once(path, make)
            except OSError as exc:  # its folder or the lock file cannot be made
                raise ConfigError(dir_field, f"the lock {lock_path(path)} cannot be made "
                                  f"({exc.strerror or exc}): {fix}") from None
            enc = made if made is not None else read(path, spec)
    if tuple(enc.input_shape) != tuple(input_shape) or enc.latent != latent:
        raise ConfigError(field_name, f"the encoder was trained on inputs {enc.input_shape} with "
                          f"latent {enc.latent}; this federation needs inputs "
                          f"{tuple(input_shape)} and latent {latent}"
                          + (f" (or set {latent_field} = {enc.latent})"
                             if tuple(enc.input_shape) == tuple(input_shape) else ""))
    return enc


def describe(enc: EncoderFile) -> dict[str, Any]:
    """A JSON-able summary (for logs and reports)."""
    return {"source": enc.source, "epochs": enc.epochs, "seed": enc.seed, "latent": enc.latent,
            "input_shape": list(enc.input_shape), "n_params": int(enc.params.numel()),
            "sha256": enc.sha256,
            "final_loss": float(np.round(enc.losses[-1], 6)) if enc.losses else None}


__all__ = [
    "EncoderFile", "cached_path", "check", "check_cache_folder", "check_fits_in_memory",
    "conv_ae_size", "default_encoder_dir",
    "describe", "load",
    "lock_path", "params_sha256", "pretrain", "pretrain_once", "resolve", "save",
]
