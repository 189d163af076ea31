"""Reporting training steps from the frameworks people train with (docs/jobs.md).

``steps.py`` times steps without synchronising them and reports them through
:mod:`fleetwatch.jobclient`; ``huggingface.py`` and ``lightning.py`` are the callbacks that use it.
Only a training process imports these modules: no daemon of ours does.
"""
