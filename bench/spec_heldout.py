"""Inventory of parts kept in bins, with reorder rules.

Written for the speculative decoding benchmark (bench/spec.sh): code the
trained models have not seen.
"""

import dataclasses
import json
from collections import defaultdict
from typing import Dict, Iterable, List, Optional


@dataclasses.dataclass
class Part:
    sku: str
    name: str
    unit_cost: float
    reorder_level: int = 0
    reorder_quantity: int = 0


@dataclasses.dataclass
class Bin:
    label: str
    capacity: int
    contents: Dict[str, int] = dataclasses.field(default_factory=dict)

    def free_space(self) -> int:
        return self.capacity - sum(self.contents.values())

    def add(self, sku: str, count: int) -> int:
        """Adds up to count parts; returns how many did not fit."""
        room = self.free_space()
        taken = min(room, count)
        if taken:
            self.contents[sku] = self.contents.get(sku, 0) + taken
        return count - taken

    def remove(self, sku: str, count: int) -> int:
        """Removes up to count parts; returns how many were removed."""
        have = self.contents.get(sku, 0)
        taken = min(have, count)
        if taken == have:
            self.contents.pop(sku, None)
        else:
            self.contents[sku] = have - taken
        return taken


class Inventory:
    def __init__(self, parts: Iterable[Part], bins: Iterable[Bin]):
        self.parts = {p.sku: p for p in parts}
        self.bins = list(bins)
        self.history: List[tuple] = []

    def count(self, sku: str) -> int:
        return sum(b.contents.get(sku, 0) for b in self.bins)

    def value(self) -> float:
        total = 0.0
        for sku, part in self.parts.items():
            total += self.count(sku) * part.unit_cost
        return total

    def receive(self, sku: str, count: int) -> int:
        if sku not in self.parts:
            raise KeyError(f"unknown part {sku!r}")
        left = count
        for b in sorted(self.bins, key=lambda b: -b.free_space()):
            left = b.add(sku, left)
            if not left:
                break
        self.history.append(("receive", sku, count - left))
        return left

    def ship(self, sku: str, count: int) -> int:
        shipped = 0
        for b in self.bins:
            shipped += b.remove(sku, count - shipped)
            if shipped == count:
                break
        self.history.append(("ship", sku, shipped))
        return shipped

    def reorders(self) -> Dict[str, int]:
        orders = {}
        for sku, part in self.parts.items():
            if self.count(sku) <= part.reorder_level:
                orders[sku] = part.reorder_quantity
        return orders

    def by_bin(self) -> Dict[str, Dict[str, int]]:
        return {b.label: dict(b.contents) for b in self.bins}

    def to_json(self) -> str:
        return json.dumps({"bins": self.by_bin(), "history": self.history}, indent=2)
