"""Hugging Face transformers: a stock ``Trainer`` loads its data with rloader.

    import rloader.integrations.transformers

    rloader.integrations.transformers.install()  # once, before trainer.train()
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=evaluation)
    trainer.train()

Why it is needed: ``Trainer`` builds each of its loaders (training, evaluation, prediction) itself,
as ``DataLoader(dataset, **params)`` with the ``DataLoader`` that ``transformers.trainer``
imported from torch, and hands it to ``self.accelerator.prepare()``, which rebuilds it as torch's
again (``rloader.integrations.accelerate``).

What ``install()`` does:

- rebinds ``transformers.trainer.DataLoader`` to ``rloader.DataLoader``: every argument Trainer
  passes reaches rloader's loader as it would torch's (``batch_size``, the data collator as
  ``collate_fn``, ``dataloader_num_workers``, ``dataloader_pin_memory``,
  ``dataloader_persistent_workers``, ``dataloader_prefetch_factor``, and, where the installed
  release passes them, ``dataloader_multiprocessing_context`` and ``dataloader_in_order``; its
  sampler or batch sampler, ``dataloader_drop_last``, and ``seed_worker`` as the training
  loader's ``worker_init_fn``);
- installs ``rloader.integrations.accelerate``, so ``prepare()`` keeps rloader's engine over the
  sampler accelerate chooses (its seedable sampler, its shards);
- rebinds ``transformers.trainer.skip_first_batches`` (imported by name when transformers was
  imported) to that integration's, so a run resumed mid-epoch (``resume_from_checkpoint``) skips
  its batches on rloader's engine too.

Trainer's samplers and collators are its own, so the batches, and the losses, are those of a
stock Trainer. Loaders that a ``Trainer`` subclass builds in its own module (an overridden
``get_train_dataloader`` that names torch's ``DataLoader``) stay torch's: build an
``rloader.DataLoader`` there. Worker processes only (torch's kind): Trainer's ``seed_worker``
seeds the process-wide random generators, which in a thread worker are the training step's.
``uninstall()`` undoes what ``install()`` did; both may be called any number of times.
"""

from __future__ import annotations

import accelerate.data_loader as _acc_data_loader
import torch.utils.data as tud
import transformers.trainer as _trainer

from ..dataloader import DataLoader
from . import accelerate as _accelerate

__all__ = ["install", "is_installed", "uninstall"]

# Whether install() installed the accelerate integration (uninstall() then removes it; one the
# user installed stays).
_installed_accelerate = False


def install() -> None:
    """Makes every ``transformers.Trainer`` load with ``rloader.DataLoader``, kept by accelerate's
    ``prepare()``. Idempotent."""
    global _installed_accelerate
    if not _accelerate.is_installed():
        _accelerate.install()
        _installed_accelerate = True
    _trainer.DataLoader = DataLoader
    ours = _acc_data_loader.skip_first_batches
    if getattr(_trainer, "skip_first_batches", None) is ours._rloader_original:
        _trainer.skip_first_batches = ours


def uninstall() -> None:
    """Puts Trainer's torch ``DataLoader`` and accelerate's ``skip_first_batches`` back.
    Idempotent."""
    global _installed_accelerate
    if _trainer.DataLoader is DataLoader:
        _trainer.DataLoader = tud.DataLoader
    skip = getattr(_trainer, "skip_first_batches", None)
    if _accelerate._is_ours(skip):
        _trainer.skip_first_batches = skip._rloader_original  # type: ignore[union-attr]
    if _installed_accelerate:
        _accelerate.uninstall()
        _installed_accelerate = False


def is_installed() -> bool:
    """Whether ``install()`` is in effect."""
    return _trainer.DataLoader is DataLoader and _accelerate.is_installed()
