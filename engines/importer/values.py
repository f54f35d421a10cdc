"""What lowering rules pass around: an activation (``Act``) and the refusal of a node of a
supported type used in a way the importer cannot lower (``Unsupported``). Their own module so that
rule modules beside ``lower`` (``recurrent``) need not import it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Act:
    """An activation: its IR tensor name, its batch-1 ONNX shape and where its batch axis is
    (None: merged into another axis, e.g. batch·heads)."""
    name: str
    shape: tuple[int, ...]
    bpos: int | None

    @property
    def per_sample(self) -> tuple[int, ...]:
        return self.shape if self.bpos is None else self.shape[:self.bpos] + self.shape[self.bpos + 1:]

    def axis(self, axis: int) -> int:
        """An ONNX axis of this value as a per-sample axis."""
        axis = axis + len(self.shape) if axis < 0 else axis
        if self.bpos is None or axis < self.bpos:
            return axis
        if axis == self.bpos:
            raise Unsupported("it works along the batch axis")
        return axis - 1


class Unsupported(Exception):
    """A node of a supported type used in a way the importer cannot lower (the reason)."""
