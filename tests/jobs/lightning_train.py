"""A tiny real Lightning ``Trainer`` run on the CPU, for the fleetwatch callback's tests.

The module is a one-layer next-token model (an embedding and a linear head) over random token
ids in dict batches (``{"input_ids": ...}``, as a tokenizer's collator yields them). No logger,
no progress bar and, unless asked, no checkpointing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytorch_lightning as pl
import torch
from lightning_fabric.plugins.environments.lightning import LightningEnvironment
from pytorch_lightning.callbacks import ModelCheckpoint
from torch import nn

if TYPE_CHECKING:
    from pathlib import Path

VOCAB = 128
SEQUENCE = 16
BATCH = 4
WIDTH = 32


class RandomTokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """``size`` sequences of random token ids, the same ones every run (seeded by index)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, VOCAB, (SEQUENCE,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids}


class TinyLanguageModel(pl.LightningModule):
    """Predicts each next token from the one before it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:  # noqa: ARG002 - Lightning's signature
        ids = batch["input_ids"]
        logits = self.head(self.embed(ids[:, :-1]))
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def train(
    callback: pl.Callback,
    output: Path,
    *,
    steps: int,
    accumulation: int = 1,
    save_steps: int = 0,
) -> TinyLanguageModel:
    """Train ``steps`` optimizer steps of ``accumulation`` batches with ``callback``; save a
    checkpoint under ``output`` every ``save_steps`` (0: never). Return the module."""
    torch.set_num_threads(1)
    module = TinyLanguageModel()
    callbacks: list[pl.Callback] = [callback]
    if save_steps:
        callbacks.append(ModelCheckpoint(dirpath=output, every_n_train_steps=save_steps))
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        accumulate_grad_batches=accumulation,
        logger=False,
        enable_checkpointing=bool(save_steps),
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        default_root_dir=output,
        # One local process, even when the test runs inside a Slurm allocation.
        plugins=[LightningEnvironment()],
    )
    data = torch.utils.data.DataLoader(
        RandomTokens(BATCH * accumulation * steps), batch_size=BATCH, num_workers=0
    )
    trainer.fit(module, train_dataloaders=data)
    return module
