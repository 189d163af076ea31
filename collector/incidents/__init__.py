"""The rules at run time: the evaluator, the incident service and rule unit tests."""
