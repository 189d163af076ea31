# Local type stubs for the part of cel-expr-python (Google's CEL C++ runtime) fleetwatch uses.
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

class Type:
    BOOL: ClassVar[Type]
    DOUBLE: ClassVar[Type]
    DYN: ClassVar[Type]
    INT: ClassVar[Type]
    LIST: ClassVar[Type]
    MAP: ClassVar[Type]
    STRING: ClassVar[Type]
    def __init__(self, signature: str) -> None: ...
    @staticmethod
    def List(element_type: Type) -> Type: ...
    @staticmethod
    def Map(key_type: Type, element_type: Type) -> Type: ...
    def name(self) -> str: ...
    def __eq__(self, other: object) -> bool: ...

class Value:
    def plain_value(self) -> Any: ...
    def type(self) -> Type: ...
    def value(self) -> Any: ...

class Expression:
    def eval(self, *, data: Mapping[str, Any] | None = ...) -> Value: ...
    def return_type(self) -> Type: ...

class Overload:
    def __init__(
        self,
        id: str | None = ...,
        return_type: Type = ...,
        parameters: Sequence[Type] = ...,
        is_member: bool = ...,
        impl: Callable[..., Any] = ...,
        signature: str | None = ...,
    ) -> None: ...

class FunctionDecl:
    def __init__(self, name: str, overloads: Sequence[Overload]) -> None: ...

class Env:
    def compile(self, expression: str, disable_check: bool = ...) -> Expression: ...

def NewEnv(
    *,
    descriptor_pool: Any = ...,
    variables: Mapping[str, Type] | None = ...,
    functions: Sequence[FunctionDecl] | None = ...,
) -> Env: ...
