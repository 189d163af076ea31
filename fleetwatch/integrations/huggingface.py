"""A Hugging Face ``transformers`` callback that reports each optimizer step to the node's agent.

Add it to the ``Trainer`` on every rank::

    from fleetwatch.integrations.huggingface import FleetwatchCallback

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[FleetwatchCallback()])

Each optimizer step (all its gradient-accumulation micro-batches) is one report, sent through
:class:`~fleetwatch.integrations.steps.StepReporter` when the next step ends:

- ``step``: ``state.global_step`` after the optimizer stepped (1 for the first step);
- ``step_time`` and ``compute_time`` (up to ``on_pre_optimizer_step``: the backward, gradient
  clipping included): from CUDA events on a GPU, read once the GPU passed them, never by
  synchronising the step; from the host's clock on the CPU (``steps.py`` says what each means);
- ``tokens``: this rank's ``input_ids`` element count over the step's forwards, or
  ``tokens_per_step`` when given (a model fed ``inputs_embeds`` has no ids to count);
- ``rank`` and ``world_size``: torch.distributed's, else ``$RANK`` and ``$WORLD_SIZE``;
- ``job``: as given, else the scheduler's, as :func:`fleetwatch.jobclient.report_step` takes it;
- ``params``: as given, else the model's parameter count (pass the full count under FSDP, whose
  ranks hold shards);
- ``checkpointing``: on the last report before the Trainer saves; the checkpoint's time (from the
  step's end, or the evaluation's before it, to ``on_save``) travels with the next report.

Nothing raises into training: ``callback.reporter`` counts the reports lost (``lost``) and its
own failures (``errors``), and logs the first of each.

Only a training process imports this module (it imports ``transformers``); no daemon does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn
from transformers import TrainerCallback

from fleetwatch.integrations.steps import CallbackSteps, batch_tokens

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle
    from transformers import TrainerControl, TrainerState, TrainingArguments


class FleetwatchCallback(CallbackSteps, TrainerCallback):
    """Reports each optimizer step of this rank to the node's fleetwatch agent.

    Takes :class:`~fleetwatch.integrations.steps.CallbackSteps`' options: ``job``,
    ``tokens_per_step``, ``params``, ``flops_per_token``, ``gpu``, ``socket_path``.
    """

    _in_step = False
    _hook: RemovableHandle | None = None

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,  # noqa: ARG002 - the Trainer's signature
        control: TrainerControl,  # noqa: ARG002
        **kwargs: Any,  # noqa: ANN401 - the Trainer's own objects
    ) -> None:
        """Time on the GPU when the Trainer trains on one; count the model and hook its inputs."""
        model = kwargs.get("model")
        if not isinstance(model, nn.Module):
            self._training_starts(on_gpu=args.device.type == "cuda", parameters=())
            return
        self._training_starts(on_gpu=args.device.type == "cuda", parameters=model.parameters())
        with self.reporter.guard():
            if self.tokens_per_step is None and self._hook is None:
                self._hook = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Before each forward: add its ``input_ids``' count to the step's tokens."""
        with self.reporter.guard():
            if self._in_step:
                ids = kwargs["input_ids"] if "input_ids" in kwargs else (args or (None,))[0]
                self._tokens += batch_tokens({"input_ids": ids})

    def on_step_begin(
        self,
        args: TrainingArguments,  # noqa: ARG002 - the Trainer's signature
        state: TrainerState,  # noqa: ARG002
        control: TrainerControl,  # noqa: ARG002
        **kwargs: Any,  # noqa: ANN401, ARG002
    ) -> None:
        """An optimizer step begins (its first micro-batch's forward follows)."""
        self._in_step = True
        self._tokens = 0
        self.reporter.begin()

    def on_pre_optimizer_step(
        self,
        args: TrainingArguments,  # noqa: ARG002 - the Trainer's signature
        state: TrainerState,  # noqa: ARG002
        control: TrainerControl,  # noqa: ARG002
        **kwargs: Any,  # noqa: ANN401, ARG002
    ) -> None:
        """Every micro-batch's forward and backward is queued: the compute ends here."""
        self.reporter.compute_done()

    def on_step_end(
        self,
        args: TrainingArguments,  # noqa: ARG002 - the Trainer's signature
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,  # noqa: ANN401, ARG002
    ) -> None:
        """The optimizer stepped: the step ends (a checkpoint follows when the Trainer saves)."""
        self._in_step = False
        with self.reporter.guard():
            self.reporter.end(
                state.global_step, self._step_tokens(), checkpointing=control.should_save
            )

    def on_evaluate(
        self,
        args: TrainingArguments,  # noqa: ARG002 - the Trainer's signature
        state: TrainerState,  # noqa: ARG002
        control: TrainerControl,
        **kwargs: Any,  # noqa: ANN401, ARG002
    ) -> None:
        """An evaluation ran; the checkpoint, when one follows, begins now."""
        with self.reporter.guard():
            if control.should_save:
                self.reporter.checkpoint_begins()

    def on_save(
        self,
        args: TrainingArguments,  # noqa: ARG002 - the Trainer's signature
        state: TrainerState,  # noqa: ARG002
        control: TrainerControl,  # noqa: ARG002
        **kwargs: Any,  # noqa: ANN401, ARG002
    ) -> None:
        """The checkpoint is written."""
        self.reporter.checkpoint_done()

    def on_train_end(
        self,
        args: TrainingArguments,  # noqa: ARG002 - the Trainer's signature
        state: TrainerState,  # noqa: ARG002
        control: TrainerControl,  # noqa: ARG002
        **kwargs: Any,  # noqa: ANN401, ARG002
    ) -> None:
        """Send the steps held and unhook the model."""
        self.reporter.close()
        with self.reporter.guard():
            if self._hook is not None:
                self._hook.remove()
                self._hook = None
