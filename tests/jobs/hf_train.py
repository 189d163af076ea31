"""A tiny real Hugging Face ``Trainer`` run on the CPU, for the fleetwatch callback's tests.

The model is a 2-layer GPT-2 (``n_embd`` 32) built from a config, so nothing is downloaded; it
trains on random token ids with no reporting integration and, unless asked, no saving.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

if TYPE_CHECKING:
    from pathlib import Path

    from transformers import TrainerCallback

VOCAB = 128
SEQUENCE = 16
BATCH = 4  # sequences per micro-batch


class RandomTokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """``size`` sequences of random token ids, the same ones every run (seeded by index)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, VOCAB, (SEQUENCE,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids}


def build_model() -> GPT2LMHeadModel:
    """A 2-layer GPT-2 with 32-wide embeddings and a 128-token vocabulary (from a config)."""
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        n_positions=SEQUENCE,
        vocab_size=VOCAB,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


def train(
    callback: TrainerCallback,
    output: Path,
    *,
    steps: int,
    accumulation: int = 1,
    save_steps: int = 0,
) -> GPT2LMHeadModel:
    """Train ``steps`` optimizer steps of ``accumulation`` micro-batches with ``callback``; save
    a checkpoint under ``output`` every ``save_steps`` (0: never). Return the model."""
    torch.set_num_threads(1)
    model = build_model()
    args = TrainingArguments(
        output_dir=str(output),
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=accumulation,
        use_cpu=True,
        report_to=[],
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    dataset = RandomTokens(BATCH * accumulation * steps)
    Trainer(model=model, args=args, train_dataset=dataset, callbacks=[callback]).train()
    return model
