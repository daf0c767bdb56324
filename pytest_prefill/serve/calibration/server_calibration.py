"""What a server calibration measures (:class:`ServerSweep`: the prompts, the traffic, the
ramps, the server's budget and cap) and what it is (:class:`ServerCalibration`: a cost model with
provenance, the request's overhead kept apart, the chunking the server showed)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pytest_prefill.measure.calibration_document import Calibration
from pytest_prefill.serve.calibration.calibration_fit import Chunking, RequestOverhead
from pytest_prefill.sim import CostModel
from pytest_prefill.sim.checks import check_int

RAMP_PROMPT = 32  # tokens: the short ramp's requests are all in their first pass or two


def _lengths(field: str, values: Any, minimum: int = 1) -> tuple[int, ...]:
    ok = isinstance(values, (tuple, list)) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in values
    )
    if not ok:
        raise ValueError(f"{field} must be integers >= {minimum}, got {values!r}")
    return tuple(sorted(set(values)))


@dataclasses.dataclass(frozen=True)
class ServerSweep:
    """What the calibration measures. ``budget`` is the server's tokens per iteration (vLLM's
    ``--max-num-batched-tokens``, ``transformers serve --cb-max-batch-tokens``, llama.cpp's
    ``-b``): it sets how a prompt is chunked, so it must be the server's. Prompts alone at
    ``prompt_lens``; traffic: requests with the prompts ``traffic_prompts`` (in that order,
    ``decode_tokens`` tokens each) sent ``stream_spacing`` seconds apart, whose decode-only
    iterations are the decode points (rows joining and leaving, contexts growing) and whose
    prompts, each landing amid the streams already decoding, give fused iterations and the way
    in; a prompt of each of ``stall_prompts`` amid ``live_rows`` streams (the chunking check);
    ``ramp_rows`` requests sent at once (0: none), whose decode iterations are the decode
    points at that many rows (spaced traffic reaches 1 or 2: a per-row cost fitted there is
    extrapolated to the rows a loaded server runs), once with short prompts and once with the
    traffic's median prompt (:attr:`ramp_prompts`), so that at those rows the cached tokens
    read vary as much as the rows do and a cost per row is told apart from a cost per cached
    token; ``max_seqs``: the server's sequence cap (0: none known), under which a prompt sent
    while that many requests are in flight waits for a slot: such traffic prompts are not read
    (:func:`~pytest_prefill.serve.calibration.experiments.traffic_stalls`) and the chunking check's prompt
    joins fewer live streams (:attr:`stall_rows`); ``repeats`` rounds of all of it
    (each round visits every point, so drift hits all); ``warmup``: times the traffic (and the
    ramp) is sent before the first round, its times dropped; ``loaded_rows`` (0: none): each
    stall prompt again amid that many streams of the ramp's longer prompt, so that the fused
    iterations' rows read as many cached tokens as a loaded server's do and a chunk's attention
    over the batch's KV (``batch_attention_per_pair``) is told apart from the rest (amid 2 short
    streams it is a few percent of the iteration, within the fit's noise: on transformers serve
    here, refused at 6.3e-8 +/- 4.4e-8 s a pair, the probes' own speeds then rose with the
    load, x1.01 at 5 requests in flight to x1.45 at 26; with 1.2e-7 they stayed within
    0.89-1.09). A server's first passes of each
    shape are slow (vLLM's CPU build compiles them; short warm-up prompts do not reach them):
    here, right after a start, the first round's 255-token passes amid a stream took 63.9,
    92.6, 53.0 and 71.1 ms and the second round's 50.6-51.4 ms."""

    budget: int
    prompt_lens: tuple[int, ...] = (16, 64, 128, 256, 512, 1024, 2048)
    traffic_prompts: tuple[int, ...] = (128, 384, 256, 512, 96, 320)
    stall_prompts: tuple[int, ...] = (1024,)
    live_rows: int = 2
    decode_tokens: int = 64
    stream_spacing: float = 0.4
    repeats: int = 3
    ramp_rows: int = 0
    warmup: int = 1
    loaded_rows: int = 0
    max_seqs: int = 0

    def __post_init__(self) -> None:
        for field in ("budget", "live_rows", "decode_tokens", "repeats"):
            check_int(field, getattr(self, field))
        for field in ("prompt_lens", "stall_prompts"):
            object.__setattr__(self, field, _lengths(field, getattr(self, field)))
        traffic = self.traffic_prompts
        if not isinstance(traffic, (tuple, list)) or len(traffic) < 2:
            raise ValueError(f"traffic_prompts must be 2 or more lengths, got {traffic!r}")
        object.__setattr__(
            self, "traffic_prompts", tuple(_lengths("traffic_prompts", [v])[0] for v in traffic)
        )
        if len(self.prompt_lens) < 3:
            raise ValueError(f"prompt_lens needs 3 or more lengths, got {self.prompt_lens!r}")
        if self.decode_tokens < 8:
            raise ValueError(f"decode_tokens must be >= 8, got {self.decode_tokens!r}")
        ok = not isinstance(self.stream_spacing, bool) and isinstance(
            self.stream_spacing, (int, float)
        )
        if not (ok and 0 < self.stream_spacing < 60):
            raise ValueError(
                f"stream_spacing must be seconds in (0, 60), got {self.stream_spacing!r}"
            )
        rows = self.ramp_rows
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0 or rows == 1:
            raise ValueError(f"ramp_rows must be 0 (none) or an integer >= 2, got {rows!r}")
        check_int("warmup", self.warmup, minimum=0)
        cap = self.max_seqs
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise ValueError(f"max_seqs must be 0 (no cap) or an integer >= 1, got {cap!r}")
        if cap and (self.ramp_rows > cap or self.loaded_rows >= cap):
            raise ValueError(
                f"ramp_rows {self.ramp_rows} and loaded_rows {self.loaded_rows} must fit the "
                f"server's cap of max_seqs {cap} (ramp_rows at most {cap}, loaded_rows below it)"
            )
        if self.budget <= self.live_rows:
            raise ValueError(f"budget {self.budget} leaves no room beside {self.live_rows} rows")
        loaded = self.loaded_rows
        if isinstance(loaded, bool) or not isinstance(loaded, int) or loaded < 0:
            raise ValueError(f"loaded_rows must be 0 (none) or an integer >= 1, got {loaded!r}")
        if loaded and not (self.ramp_rows and loaded < self.budget):
            raise ValueError(
                f"loaded_rows {loaded} needs a ramp (ramp_rows >= 2, got {self.ramp_rows}) for "
                f"its streams' prompt and a budget above it (got {self.budget})"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def ramp_prompts(self) -> tuple[int, ...]:
        """The ramp's prompt lengths, one ramp each: ``RAMP_PROMPT`` tokens, and the traffic's
        median prompt (the lower middle one) when it is longer: with ``ramp_rows`` rows
        decoding, the second reads ``ramp_rows`` x that many cached tokens, as a loaded
        server's rows do, where short prompts' rows read a few hundred. On a vLLM CPU server
        (budget 256, 8 seqs) the decode steps of a loaded run grew with the cached tokens they
        read (a fit over them gave 1.2 us a cached token), which short rows cannot show."""
        if not self.ramp_rows:
            return ()
        middle = sorted(self.traffic_prompts)[(len(self.traffic_prompts) - 1) // 2]
        return (RAMP_PROMPT, middle) if middle > RAMP_PROMPT else (RAMP_PROMPT,)

    @property
    def stall_rows(self) -> int:
        """The live streams the chunking check's prompt is sent amid: ``live_rows``, fewer
        under the cap (the prompt must join them, not wait for a slot); 0: none can."""
        return min(self.live_rows, self.max_seqs - 1) if self.max_seqs else self.live_rows

    def capped(self, max_seqs: int | None) -> ServerSweep:
        """This sweep on a server that runs at most ``max_seqs`` requests at once (None or 0:
        no cap known): its ramps cut to the cap and its loaded stall's rows below it."""
        if not max_seqs:
            return self
        ramp = min(self.ramp_rows, max_seqs) if max_seqs >= 2 else 0
        loaded = min(self.loaded_rows, max_seqs - 1) if ramp else 0
        return dataclasses.replace(self, max_seqs=max_seqs, ramp_rows=ramp, loaded_rows=loaded)

    @property
    def least_max_prompt(self) -> int:
        """The shortest ``max_prompt`` :meth:`within` keeps this sweep's fit with: its
        third-shortest prompt length (the prefill line is fitted through 3 or more) and its
        second-shortest traffic prompt (2 or more are sent)."""
        return max(sorted(self.prompt_lens)[2], sorted(self.traffic_prompts)[1])

    def within(self, max_prompt: int) -> ServerSweep:
        """This sweep without prompts longer than ``max_prompt`` tokens (the longest stall
        prompt kept if none is that short).

        Raises:
            ValueError: naming ``max_prompt`` and the least it may be, and why.
        """
        least = self.least_max_prompt
        if max_prompt < least:
            fitted = ", ".join(map(str, sorted(self.prompt_lens)[:3]))
            traffic = ", ".join(map(str, sorted(self.traffic_prompts)[:2]))
            raise ValueError(
                f"max_prompt must be at least {least} tokens, got {max_prompt}: the calibration "
                f"fits prefill through 3 or more prompt lengths (the shortest: {fitted}) and "
                f"sends 2 or more traffic prompts (the shortest: {traffic})"
            )

        def cut(values: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(v for v in values if v <= max_prompt) or (max_prompt,)

        return dataclasses.replace(
            self,
            prompt_lens=cut(self.prompt_lens),
            traffic_prompts=cut(self.traffic_prompts),
            stall_prompts=cut(self.stall_prompts),
        )


@dataclasses.dataclass(frozen=True)
class ServerCalibration:
    """A server's calibration: the ``Calibration`` (cost model, provenance, points, fits,
    refusals, each prompt's fitted and held-out TTFT), the request's overhead kept apart, and
    the chunking its long prompts showed."""

    calibration: Calibration
    overhead: RequestOverhead
    chunking: tuple[Chunking, ...]
    sweep: ServerSweep

    @property
    def cost(self) -> CostModel:
        return self.calibration.cost

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.calibration.to_dict(),
            "server": {
                "overhead": self.overhead.to_dict(),
                "chunking": [c.to_dict() for c in self.chunking],
                "sweep": self.sweep.to_dict(),
            },
        }

    @classmethod
    def from_dict(cls, data: Any) -> ServerCalibration:
        """Raises: ValueError for anything that is not a server calibration."""
        server = data.get("server") if isinstance(data, Mapping) else None
        if not isinstance(server, Mapping):
            raise ValueError("not a server calibration: it has no 'server' block")
        for name, kind in (("sweep", Mapping), ("chunking", list), ("overhead", Mapping)):
            if not isinstance(server.get(name), kind):
                what = "an object" if kind is Mapping else "a list"
                raise ValueError(f"server.{name} must be {what}, got {server.get(name)!r:.60}")
        try:
            fields: dict[str, Any] = {
                "warmup": 0,  # calibrations from before the warm-up had none
                **{k: tuple(v) if isinstance(v, list) else v for k, v in server["sweep"].items()},
            }
            sweep = ServerSweep(**fields)
            chunking = tuple(
                Chunking(c["prompt_len"], c["rows"], c["expected"], c["seen"])
                for c in server["chunking"]
            )
            overhead = RequestOverhead.from_dict(server["overhead"])
        except (KeyError, TypeError, AttributeError, OverflowError, IndexError) as err:
            raise ValueError(f"corrupt server calibration: {err!s}") from None
        try:
            calibration = Calibration.from_dict(data)
        except (KeyError, TypeError, AttributeError, OverflowError, IndexError) as err:
            raise ValueError(f"corrupt calibration: {err!s}") from None
        return cls(calibration, overhead, chunking, sweep)


def read_server_calibration(path: str) -> ServerCalibration:
    """The server calibration at ``path`` (``server-calibrate --json``).

    Raises:
        ValueError: naming the file, and the field where one is at fault, in one line.
    """
    from pytest_prefill._io import read_json

    try:
        return ServerCalibration.from_dict(read_json(path, "server calibration"))
    except ValueError as err:
        text = str(err)
        raise ValueError(text if text.startswith(path) else f"{path}: {text}") from None
