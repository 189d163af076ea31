"""A Lightning callback that reports each optimizer step to the node's fleetwatch agent.

Add it to the ``Trainer``, which runs it on every rank::

    from fleetwatch.integrations.lightning import FleetwatchCallback

    trainer = pytorch_lightning.Trainer(max_steps=10_000, callbacks=[FleetwatchCallback()])

Built on ``pytorch_lightning``'s ``Callback``; ``lightning.pytorch``'s Trainer calls callbacks by
their hooks' names, so the same callback serves it (that pairing is not tested here).

Each optimizer step (all the batches it accumulates) is one report, sent through
:class:`~fleetwatch.integrations.steps.StepReporter` when the next step ends:

- ``step``: ``trainer.global_step`` after the optimizer stepped (1 for the first step);
- ``step_time`` (from its first batch's start to its last batch's end) and ``compute_time`` (up
  to ``on_before_optimizer_step``, after the backward): from CUDA events on a GPU, read once the
  GPU passed them, never by synchronising the step; from the host's clock on the CPU
  (``steps.py`` says what each means);
- ``tokens``: this rank's ``input_ids`` element count in its batches (a mapping's key or an
  attribute), or ``tokens_per_step`` when given (batches of another shape);
- ``rank`` and ``world_size``: torch.distributed's, else ``$RANK`` and ``$WORLD_SIZE``;
- ``job``: as given, else the scheduler's, as :func:`fleetwatch.jobclient.report_step` takes it;
- ``params``: as given, else the module's parameter count (pass the full count under FSDP, whose
  ranks hold shards);
- ``checkpointing``: when a checkpoint is saved (``on_save_checkpoint``), the steps held are sent
  at once, the last so marked; the checkpoint's time (to the next batch's start) travels with
  the next report.

Nothing raises into training: ``callback.reporter`` counts the reports lost (``lost``) and its
own failures (``errors``), and logs the first of each.

Only a training process imports this module (it imports ``pytorch_lightning``); no daemon does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytorch_lightning import Callback

from fleetwatch.integrations.steps import CallbackSteps, batch_tokens

if TYPE_CHECKING:
    import pytorch_lightning as pl
    from pytorch_lightning.utilities.types import STEP_OUTPUT
    from torch.optim import Optimizer


class FleetwatchCallback(CallbackSteps, Callback):
    """Reports each optimizer step of this rank to the node's fleetwatch agent.

    Takes :class:`~fleetwatch.integrations.steps.CallbackSteps`' options: ``job``,
    ``tokens_per_step``, ``params``, ``flops_per_token``, ``gpu``, ``socket_path``.
    """

    _step_from: int | None = None  # the global step an open step began at

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:  # noqa: ARG002 - Lightning's signature
        """Time on the GPU when the module trains on one; count its parameters."""
        self._training_starts(
            on_gpu=pl_module.device.type == "cuda", parameters=pl_module.parameters()
        )

    def on_train_batch_start(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,  # noqa: ARG002 - Lightning's signature
        batch: Any,  # noqa: ANN401 - whatever the data loader yields
        batch_idx: int,  # noqa: ARG002
    ) -> None:
        """A batch begins; the first of an optimizer step begins the step."""
        self.reporter.checkpoint_done()
        with self.reporter.guard():
            if self._step_from is None:
                self._step_from = trainer.global_step
                self._tokens = 0
                self.reporter.begin()
            self._tokens += batch_tokens(batch)

    def on_before_optimizer_step(
        self,
        trainer: pl.Trainer,  # noqa: ARG002 - Lightning's signature
        pl_module: pl.LightningModule,  # noqa: ARG002
        optimizer: Optimizer,  # noqa: ARG002
    ) -> None:
        """Every accumulated batch's forward and backward is queued: the compute ends here."""
        self.reporter.compute_done()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,  # noqa: ARG002 - Lightning's signature
        outputs: STEP_OUTPUT,  # noqa: ARG002
        batch: Any,  # noqa: ANN401, ARG002 - whatever the data loader yields
        batch_idx: int,  # noqa: ARG002
    ) -> None:
        """A batch ended; when the optimizer stepped after it, so does the step."""
        with self.reporter.guard():
            if self._step_from is None or trainer.global_step == self._step_from:
                return  # no step open, or gradients still accumulate
            self._step_from = None
            self.reporter.end(trainer.global_step, self._step_tokens())

    def on_save_checkpoint(
        self,
        trainer: pl.Trainer,  # noqa: ARG002 - Lightning's signature
        pl_module: pl.LightningModule,  # noqa: ARG002
        checkpoint: dict[str, Any],  # noqa: ARG002
    ) -> None:
        """A checkpoint is being saved: send the steps held, the last marked checkpointing."""
        self.reporter.checkpoint_begins()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:  # noqa: ARG002 - Lightning's signature
        """Send the steps held."""
        self.reporter.close()
