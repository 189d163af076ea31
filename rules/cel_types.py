"""The types of the variables rule conditions see, and the check that a condition gives a bool.

The collector hands CEL plain maps, so the environment that evaluates conditions declares every
variable as ``dyn``: CEL then accepts ``node.gpus`` (a number) as a condition and
``node.name + 1`` (text plus a number) as an expression, and both only fail at run time, where
a failing condition silently counts as not holding. The load-time check here compiles each
condition once more in environments where the variables are protobuf messages built from
:data:`VARIABLE_TYPES`, so that CEL's own type checker sees each field's type:

- text and true/false fields are typed (nullable, as wrapper types), lists of names are lists
  of strings; numbers are ``dyn`` in the first environment, because the evaluating runtime
  compares an int with a double (``signals.x == 1``) while CEL's checker would not;
- a condition whose type CEL then finds is not ``bool`` is refused, with the type named;
- a condition that is still ``dyn`` (a bare number field or signal) is compiled with every
  number a double, then an int: when either gives a number, it is refused as well.

Whatever only the message types refuse (``size(gpu)``, ``"x" in gpu``: the maps allow them) is
not held against a condition: those compile errors name the check's own package and are
ignored. The messages exist only for the check; evaluation never sees them.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import TYPE_CHECKING, Final

from cel_expr_python import cel
from google.protobuf import descriptor_pb2, descriptor_pool, struct_pb2, wrappers_pb2

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from rules.model import Scope

__all__ = ["VARIABLE_TYPES", "ConditionTypes", "Kind"]


class Kind(StrEnum):
    """What a variable's field holds (``collector.incidents.cel_data`` and ``JobBook``)."""

    TEXT = "text"
    BOOL = "bool"
    NUMBER = "number"
    NAMES = "names"  # a list of strings
    SIGNALS = "signals"  # signal name -> latest value (number or text)


_T, _B, _N, _L, _S = Kind.TEXT, Kind.BOOL, Kind.NUMBER, Kind.NAMES, Kind.SIGNALS
# Every field of every variable; a unit test builds the collector's maps and compares both the
# names and the types of the values, so neither side can change alone.
VARIABLE_TYPES: Final[dict[str, dict[str, Kind]]] = {
    "node": {
        "name": _T,
        "reachable": _B,
        "connected": _B,
        "gpus": _N,
        "gpus_lost": _N,
        "nvlinks_down": _N,
        "ib_ports": _N,
        "ib_ports_down": _N,
        "remediations_7d": _N,
        "incidents_7d": _N,
        "seen_by_person": _B,
        "signals": _S,
    },
    "gpu": {
        "index": _N,
        "uuid": _T,
        "model": _T,
        "pci_bus_id": _T,
        "present": _B,
        "nvlink_count": _N,
        "nvlinks_down": _N,
        "signals": _S,
    },
    "rank": {
        "job": _T,
        "rank": _N,
        "straggler": _B,
        "slowdown": _N,
        "straggler_steps": _N,
        "job_gpus": _N,
        "lost_gpu_hours_per_hour": _N,
        "hang_culprit": _B,
        "hang_hardware": _B,
    },
    "job": {
        "id": _T,
        "active": _B,
        "state": _T,
        "silent_s": _N,
        "hang_deadline_s": _N,
        "ranks_gone": _N,
        "culprits": _L,
        "culprit_nodes": _L,
        "world_size": _N,
        "ranks": _N,
        "ranks_missing": _N,
        "missing_nodes": _L,
        "nodes": _N,
        "gpus": _N,
        "step": _N,
        "step_time_s": _N,
        "tokens_per_s": _N,
        "tokens_per_s_per_gpu": _N,
        "mfu": _N,
        "ettr": _N,
        "goodput_tokens_per_s": _N,
        "restarts": _N,
        "stragglers": _N,
        "straggler_nodes": _L,
        "lost_gpu_hours_per_hour": _N,
        "drop": _B,
        "drop_share": _N,
        "drop_cause": _T,
        "suspects": _L,
        "fabric": _B,
        "fabric_nodes": _L,
        "checkpoint_age_s": _N,
        "checkpoint_cost_s": _N,
        "checkpoint_interval_s": _N,
        "checkpoint_overdue": _B,
        "summary": _T,
    },
    "link": {"index": _N, "up": _B, "signals": _S},
    "port": {
        "device": _T,
        "port": _N,
        "state": _T,
        "phys_state": _T,
        "up": _B,
        "rate": _T,
        "signals": _S,
    },
    "fleet": {
        "nodes": _N,
        "nodes_reachable": _N,
        "gpus": _N,
        "ib_ports": _N,
        "ib_ports_up": _N,
        "drained_nodes": _N,
        "drains_waiting": _N,
        "drain_cap": _N,
        "drain_breaker_open": _B,
    },
}

MAX_PROBLEM: Final = 500  # characters of a compiler message kept in a problem
_PACKAGE: Final = "fleetwatch_rule_check"
# How a number field is declared in each of the three environments.
_NUMBERS: Final = {
    "dyn": ".google.protobuf.Value",
    "double": ".google.protobuf.DoubleValue",
    "int": ".google.protobuf.Int64Value",
}
_SCALARS: Final = {_T: ".google.protobuf.StringValue", _B: ".google.protobuf.BoolValue"}
_WRAPPER: Final = re.compile(r"wrapper\((\w+)\)")
_FIELD_TYPE = descriptor_pb2.FieldDescriptorProto


def _message_name(variable: str) -> str:
    return variable.capitalize()


def _descriptor_pool(numbers: str) -> descriptor_pool.DescriptorPool:
    """One message per variable, its number fields declared as ``_NUMBERS[numbers]``."""
    file = descriptor_pb2.FileDescriptorProto(
        name=f"{_PACKAGE}_{numbers}.proto", package=_PACKAGE, syntax="proto3"
    )
    file.dependency.extend(["google/protobuf/wrappers.proto", "google/protobuf/struct.proto"])
    optional, repeated = _FIELD_TYPE.LABEL_OPTIONAL, _FIELD_TYPE.LABEL_REPEATED
    message_type = _FIELD_TYPE.TYPE_MESSAGE
    for variable, fields in VARIABLE_TYPES.items():
        message = file.message_type.add(name=_message_name(variable))
        for number, (name, kind) in enumerate(sorted(fields.items()), start=1):
            if kind is Kind.NAMES:
                message.field.add(
                    name=name, number=number, type=_FIELD_TYPE.TYPE_STRING, label=repeated
                )
            elif kind is Kind.SIGNALS:
                entry = message.nested_type.add(name="SignalsEntry")
                entry.options.map_entry = True
                entry.field.add(name="key", number=1, type=_FIELD_TYPE.TYPE_STRING, label=optional)
                # Numbers, mostly; text too (an IB port's state), which the first environment
                # (dyn) allows and the others only decide about a bare signal.
                entry.field.add(
                    name="value", number=2, type=message_type, type_name=_NUMBERS[numbers]
                )
                entry_name = f".{_PACKAGE}.{message.name}.SignalsEntry"
                message.field.add(
                    name=name,
                    number=number,
                    type=message_type,
                    type_name=entry_name,
                    label=repeated,
                )
            else:
                type_name = _NUMBERS[numbers] if kind is Kind.NUMBER else _SCALARS[kind]
                message.field.add(
                    name=name, number=number, type=message_type, type_name=type_name, label=optional
                )
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    pool.AddSerializedFile(struct_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    return pool


def _check_functions() -> list[cel.FunctionDecl]:
    """The window functions with the types they give (``xids`` a list of maps, here)."""

    def unused(*_args: object) -> object:  # the check only compiles
        raise NotImplementedError

    s, d = cel.Type.STRING, cel.Type.DOUBLE
    signatures: dict[str, tuple[list[cel.Type], cel.Type]] = {
        "events": ([s, s], cel.Type.INT),
        "xids": ([s], cel.Type.List(cel.Type.Map(s, cel.Type.DYN))),
        "increase": ([s, s], d),
        "rate": ([s, s], d),
        "rises": ([s, s], cel.Type.INT),
        "share_of_ports": ([s, d], d),
    }
    return [
        cel.FunctionDecl(
            name,
            [
                cel.Overload(
                    f"fleetwatch_check_{name}",
                    return_type=returns,
                    parameters=params,
                    impl=unused,
                )
            ],
        )
        for name, (params, returns) in signatures.items()
    ]


class ConditionTypes:
    """Compiles conditions against the typed variables of each scope; see the module's doc."""

    def __init__(self, scope_variables: Mapping[Scope, Sequence[str]]) -> None:
        """Build one environment per scope and way of typing numbers (a few ms in all)."""
        functions = _check_functions()
        self._envs: dict[str, dict[Scope, cel.Env]] = {}
        for numbers in _NUMBERS:
            pool = _descriptor_pool(numbers)
            self._envs[numbers] = {
                scope: cel.NewEnv(
                    descriptor_pool=pool,
                    variables={
                        name: cel.Type(f"{_PACKAGE}.{_message_name(name)}") for name in names
                    },
                    functions=functions,
                )
                for scope, names in scope_variables.items()
            }

    def problem(self, scope: Scope, condition: str) -> str | None:
        """Why ``condition`` cannot give true or false in ``scope``, or None when it can.

        Call it for conditions that compile where the variables are ``dyn``.
        """
        given = self._type(self._envs["dyn"][scope], condition)
        if isinstance(given, _TypeError):
            return given.message
        if given is None or given == cel.Type.BOOL:
            return None
        if given != cel.Type.DYN:
            return _not_bool(given.name())
        for numbers in ("double", "int"):
            typed = self._type(self._envs[numbers][scope], condition)
            if isinstance(typed, cel.Type) and typed in (cel.Type.DOUBLE, cel.Type.INT):
                return _not_bool("double")
        return None

    @staticmethod
    def _type(env: cel.Env, condition: str) -> cel.Type | _TypeError | None:
        """The condition's type; a type error; None when only the messages refuse it."""
        try:
            return env.compile(condition).return_type()
        except RuntimeError as exc:
            text = str(exc)
            if _PACKAGE in text:
                return None
            text = _WRAPPER.sub(r"\1", text.removeprefix("INVALID_ARGUMENT: "))
            cut = text if len(text) <= MAX_PROBLEM else text[: MAX_PROBLEM - 3] + "..."
            return _TypeError(f"bad condition: {cut}")


class _TypeError:
    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


def _not_bool(type_name: str) -> str:
    """The problem of a condition of type ``type_name`` (as CEL names it), in plain words."""
    name = type_name.lower()
    if name in {"int", "uint", "double"}:
        shown = "a number"
    elif name == "string":
        shown = "text"
    elif name.startswith(("list", "map")):
        shown = f"a {name.split('<', 1)[0]} ({name})"
    else:
        shown = name
    return f"when must give true or false; this condition gives {shown}"
