"""How results.json's objects are read: typed access to one object's fields, where every error
names the object (`Fields`), and the readers of the closed records that bench.results.records' classes hold
(graph sets, profile rows, ratios, recommendations)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any, TypeVar

from bench.errors import BenchError
from bench.results.logparse import GraphSet
from bench.results.recommendation import Recommendation

T = TypeVar("T")


class ResultsError(BenchError, ValueError):
    """A results.json that does not have the layout bench.results.records describes."""


def check_extra(record: Any, extra: Mapping[str, Any], reserved: tuple[str, ...] = ()) -> None:
    """Extra keys are the JSON keys no field stands for: none may shadow a field."""
    known = {f.name for f in fields(record) if f.name != "extra"} | set(reserved)
    clash = sorted(known & set(extra))
    if clash:
        raise ValueError(f"extra keys {clash} are fields of {type(record).__name__}")


class Fields:
    """One JSON object's fields, read by type; every error names the object. `rest()`: the keys not read."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, dict):
            raise ResultsError(f"{where}: expected an object, got {type(data).__name__}")
        self.data: dict[str, Any] = data
        self.where = where
        self.read: set[str] = set()

    def has(self, key: str) -> bool:
        return key in self.data

    def get(self, key: str) -> Any:
        self.read.add(key)
        if key not in self.data:
            raise ResultsError(f"{self.where}: no {key!r}")
        return self.data[key]

    def opt(self, parse: Callable[[str], T], key: str) -> T | None:
        """parse(key) when the key is there, else None (a null is parsed like any other value)."""
        self.read.add(key)
        return parse(key) if key in self.data else None

    def nullable(self, parse: Callable[[str], T], key: str) -> T | None:
        """parse(key) of a key that must be there and may be null."""
        return None if self.get(key) is None else parse(key)

    def integer(self, key: str) -> int:
        v = self.get(key)
        if not isinstance(v, int) or isinstance(v, bool):
            raise ResultsError(f"{self.where}.{key}: expected an integer, got {v!r}")
        return v

    def number(self, key: str) -> float:
        v = self.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise ResultsError(f"{self.where}.{key}: expected a number, got {v!r}")
        return float(v)

    def text(self, key: str) -> str:
        v = self.get(key)
        if not isinstance(v, str):
            raise ResultsError(f"{self.where}.{key}: expected a string, got {v!r}")
        return v

    def items(self, key: str) -> list[Any]:
        v = self.get(key)
        if not isinstance(v, list):
            raise ResultsError(f"{self.where}.{key}: expected a list, got {type(v).__name__}")
        return v

    def numbers(self, key: str) -> tuple[float, ...]:
        v = self.items(key)
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            raise ResultsError(f"{self.where}.{key}: expected a list of numbers, got {v!r}")
        return tuple(float(x) for x in v)

    def integers(self, key: str) -> tuple[int, ...]:
        v = self.items(key)
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise ResultsError(f"{self.where}.{key}: expected a list of integers, got {v!r}")
        return tuple(v)

    def texts(self, key: str) -> tuple[str, ...]:
        v = self.items(key)
        if not all(isinstance(x, str) for x in v):
            raise ResultsError(f"{self.where}.{key}: expected a list of strings, got {v!r}")
        return tuple(v)

    def rest(self) -> dict[str, Any]:
        return {k: v for k, v in self.data.items() if k not in self.read}

    def closed(self) -> None:
        unknown = self.rest()
        if unknown:
            raise ResultsError(f"{self.where}: unknown key(s) {', '.join(map(repr, unknown))}")


def str_map(data: Any, where: str) -> dict[str, str]:
    r = Fields(data, where)
    return {k: r.text(k) for k in r.data}


def int_key(key: str, where: str) -> int:
    try:
        return int(key)
    except ValueError:
        raise ResultsError(f"{where}: key {key!r} is not an integer") from None


def graph_set(data: Any, where: str) -> GraphSet:
    r = Fields(data, where)
    sizes = r.items("sizes")
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in sizes):
        raise ResultsError(f"{where}.sizes: expected a list of integers, got {sizes!r}")
    out = GraphSet(r.text("kind"), tuple(sizes), r.number("seconds"), r.number("gigabytes"))
    r.closed()
    return out


def ranked_row(row: Any, where: str) -> tuple[str, float, int]:
    if not isinstance(row, list) or len(row) != 3:
        raise ResultsError(f"{where}: expected [name, ms, count], got {row!r}")
    r = Fields(dict(zip(("name", "ms", "count"), row, strict=True)), where)
    return r.text("name"), r.number("ms"), r.integer("count")


def ratio_map(data: Any, where: str) -> dict[int, float]:
    r = Fields(data, where)
    return {int_key(k, where): r.number(k) for k in r.data}


def ratios_from(data: Any, where: str) -> dict[str, dict[int, float]]:
    return {name: ratio_map(v, f"{where}[{name!r}]") for name, v in Fields(data, where).data.items()}


def ratios_json(ratios: Mapping[str, Mapping[int, float]]) -> dict[str, dict[str, float]]:
    return {name: {str(c): v for c, v in rs.items()} for name, rs in ratios.items()}


def recommendation(data: Any, where: str) -> Recommendation:
    r = Fields(data, where)
    out = Recommendation(
        kind=r.text("kind"),
        crossover=r.nullable(r.number, "crossover"),
        disable_batch_size=r.nullable(r.integer, "disable_batch_size"),
        enable_batch_size=r.nullable(r.integer, "enable_batch_size"),
        flags=r.text("flags"),
        message=r.text("message"),
        ratios=ratio_map(r.get("ratios"), f"{where}.ratios"),
        notes=list(r.texts("notes")),
    )
    r.closed()
    return out
