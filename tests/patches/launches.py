"""Counting the tensor ops a piece of host code runs: on a GPU each is a kernel launch."""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class LaunchedOps(TorchDispatchMode):
    """The tensor ops run inside the `with` block, in order (views included)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Any] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        self.ops.append(func)
        return func(*args, **(kwargs or {}))
