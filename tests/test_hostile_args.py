"""Small hostile inputs: numbers not in ASCII digits where numbers are ASCII, and ``verify
--rank`` beside options it would ignore."""

from __future__ import annotations

import pytest
from cli_errors import usage_error

from pytest_prefill.serve.launch import transformers_capped

VERIFY = ["verify", "--url", "http://127.0.0.1:9", "--slo", "ttft:1s"]


@pytest.mark.parametrize(
    "flags", ["tokens=٢٥٦", "tokens=256,seqs=٨", "tokens=²", "tokens=" + "9" * 5000]
)
def test_a_flag_set_in_other_digits_is_a_usage_error(flags, capsys):
    assert "--flags" in usage_error([*VERIFY, "--flags", flags], capsys)


@pytest.mark.parametrize("divisors", ["٤:٨", "4:٨", "²:1", "9" * 5000 + ":1"])
def test_divisors_in_other_digits_are_a_usage_error(divisors, capsys):
    argv = [*VERIFY, "--flags", "tokens=16", "--lengths-divided-by", divisors]
    assert "--lengths-divided-by" in usage_error(argv, capsys)


@pytest.mark.parametrize("cap", ["²", "١٢", "9" * 5000, "0"])
def test_the_cap_script_takes_ascii_digits_only(cap, capsys):
    argv = ["--max-requests-per-batch", cap, "serve", "m"]
    assert transformers_capped.main(argv) == 2
    assert "--max-requests-per-batch" in capsys.readouterr().err


@pytest.mark.parametrize(
    "beside",
    [["--json", "out.json"], ["--launch", "vllm"], ["--flags", "tokens=16"], ["--slo", "ttft:1s"]],
)
def test_rank_refuses_what_it_would_ignore(tmp_path, beside, capsys):
    message = usage_error(["verify", "--rank", str(tmp_path / "a.json"), *beside], capsys)
    assert beside[0] in message
    assert not (tmp_path / "out.json").exists()


def _shortest_calibration() -> int:
    """The least --max-prompt a calibration sweep keeps its fit with: its third-shortest prompt
    length (a line through 3) and its second-shortest traffic prompt (2 or more)."""
    from pytest_prefill.serve.calibration.server_calibration import ServerSweep

    sweep = ServerSweep(256)
    return max(sorted(sweep.prompt_lens)[2], sorted(sweep.traffic_prompts)[1])


CALIBRATE = ["calibrate-server", "--url", "http://127.0.0.1:9", "--budget", "256"]


@pytest.mark.parametrize("argv", [[*VERIFY, "--flags", "tokens=256"], CALIBRATE])
def test_a_max_prompt_too_short_to_calibrate_is_one_line_naming_the_least(argv, capsys):
    least = _shortest_calibration()
    line = usage_error([*argv, "--max-prompt", str(least - 1)], capsys)
    assert "--max-prompt" in line and f"at least {least}" in line
    assert "prompt lengths" in line  # why: what the calibration fits through


def test_the_least_max_prompt_calibrates_with_every_length_kept_within_it():
    from pytest_prefill.serve.calibration.server_calibration import ServerSweep

    least = _shortest_calibration()
    sweep = ServerSweep(256).within(least)
    assert max(sweep.prompt_lens + sweep.traffic_prompts + sweep.stall_prompts) <= least
    with pytest.raises(ValueError, match="max_prompt"):
        ServerSweep(256).within(least - 1)
