"""Stop rules of a DynamicLoop and iteration counts, evaluated per request."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from walkserve.core.errors import GraphError
from walkserve.core.params import RequestParams

# An iteration count: a constant, the name of a field of the model's params, or a function of the request's params.
Count = int | str | Callable[[RequestParams], int]


def max_tokens(params: RequestParams) -> int:
    """The iteration count of a token loop: the request's ``sampling.max_tokens``."""
    return params.sampling.max_tokens  # a processor always fills it


def resolve_count(count: Count, params: RequestParams, what: str) -> int:
    """The count for one request; raises ValueError naming ``what`` when it is not a positive int."""
    if isinstance(count, bool):
        raise ValueError(f"{what}: {count!r} is not an iteration count")
    if isinstance(count, int):
        value = count
    elif isinstance(count, str):
        if count not in params.model.__struct_fields__:
            raise ValueError(f"{what}: the request's {type(params.model).__name__} has no field {count!r}")
        value = getattr(params.model, count)
    else:
        value = count(params)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive integer for this request, got {value!r}")
    return value


def check_count(count: Count, what: str) -> None:
    if isinstance(count, bool) or not (isinstance(count, (int, str)) or callable(count)):
        raise GraphError(f"{what} must be an int, a model params field name or a function, got {count!r}")
    if isinstance(count, int) and count < 1:
        raise GraphError(f"{what} must be >= 1, got {count}")


def scalar(value: Any) -> Any:
    """The single element of a one-element tensor/array/list, or the value itself."""
    if hasattr(value, "reshape") and hasattr(value, "tolist"):
        flat = value.reshape(-1).tolist()
        return flat[0] if len(flat) == 1 else flat
    if isinstance(value, (list, tuple)) and len(value) == 1:
        return value[0]
    return value


class StopRule(ABC):
    """Decides, from one output of one iteration, whether a request's loop stops after it.

    ``output`` is the ``"node.output"`` the rule reads; the node must sit
    directly in the loop's body. With ``include_stopping=False`` the outputs
    of the iteration that triggered the stop are never exposed (an EOS token
    is not streamed to the client or into a codec).
    """

    output: str
    include_stopping: bool

    @abstractmethod
    def should_stop(self, value: Any, params: RequestParams, iteration: int) -> bool: ...

    @abstractmethod
    def describe(self) -> str: ...


@dataclass(frozen=True)
class StopOnValue(StopRule):
    """Stop when the output's value is one of ``values`` or, with ``stop_token_ids``, of the request's
    ``sampling.stop_token_ids``."""

    output: str
    values: Sequence[int] = ()
    stop_token_ids: bool = False
    include_stopping: bool = False

    def should_stop(self, value: Any, params: RequestParams, iteration: int) -> bool:
        v = scalar(value)
        if v in self.values:
            return True
        return self.stop_token_ids and v in params.sampling.stop_token_ids

    def describe(self) -> str:
        what = list(self.values) if self.values else "sampling.stop_token_ids"
        return f"stop when {self.output} in {what}"


@dataclass(frozen=True)
class StopWhen(StopRule):
    """Stop when ``predicate(value, params, iteration)`` is true."""

    output: str
    predicate: Callable[[Any, RequestParams, int], bool] = field(compare=False)
    include_stopping: bool = True
    label: str = "predicate"

    def should_stop(self, value: Any, params: RequestParams, iteration: int) -> bool:
        return bool(self.predicate(value, params, iteration))

    def describe(self) -> str:
        return f"stop when {self.label}({self.output})"
