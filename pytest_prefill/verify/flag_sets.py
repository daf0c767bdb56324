"""A flag set: what a server is started with, the engine's token budget and sequence cap.
Standard library only."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from pytest_prefill.verify.fields import Fields

FLAGS = re.compile(r"^tokens=([0-9]{1,12})(?:,seqs=([0-9]{1,12}))?$")  # ASCII digits only


@dataclasses.dataclass(frozen=True)
class FlagSet:
    """What a server is started with: ``budget`` tokens an iteration, decode rows included
    (vLLM ``--max-num-batched-tokens``, ``transformers serve --cb-max-batch-tokens``,
    llama.cpp ``-b``) and the sequence cap ``max_seqs`` (vLLM ``--max-num-seqs``, llama.cpp
    ``-np``; None: the engine's default).

    Raises:
        ValueError: naming the field, for a budget below 2 or a cap below 1.
    """

    budget: int
    max_seqs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 2:
            raise ValueError(f"flag set budget must be an integer >= 2, got {self.budget!r}")
        seqs = self.max_seqs
        if seqs is not None and (isinstance(seqs, bool) or not isinstance(seqs, int) or seqs < 1):
            raise ValueError(f"flag set max_seqs must be an integer >= 1, got {seqs!r}")

    @classmethod
    def parse(cls, text: str) -> FlagSet:
        """``tokens=256`` or ``tokens=256,seqs=8`` (a capacity deployment's settings).

        Raises:
            ValueError: for anything else.
        """
        match = FLAGS.match(str(text).strip())
        if match is None:
            raise ValueError(f"a flag set is tokens=N or tokens=N,seqs=N, got {text!r}")
        seqs = match.group(2)
        return cls(int(match.group(1)), int(seqs) if seqs is not None else None)

    @property
    def label(self) -> str:
        seqs = f", ≤{self.max_seqs} seqs" if self.max_seqs is not None else ""
        return f"≤{self.budget} tok{seqs}"

    def to_dict(self) -> dict[str, Any]:
        return {"budget": self.budget, "max_seqs": self.max_seqs, "label": self.label}

    @classmethod
    def from_dict(cls, fields: Fields) -> FlagSet:
        """Raises: ValueError naming the field, for one missing, of the wrong type or out of
        range."""
        flags: FlagSet = fields.values_of(cls)
        return flags
