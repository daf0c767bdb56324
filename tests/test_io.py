"""Files in and out: writes go through symlinks and never replace a special file; JSON that is
too large, too deep, not UTF-8, or holds an integer no float can hold is an error naming the
file. Special files are made here (FIFOs, symlinks) or only inspected (/dev/null, /dev/zero are
opened for reading at most; nothing is ever written to /dev or /sys)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from pytest_prefill import _io
from pytest_prefill._io import check_destination, read_json, write_atomic, write_json_atomic

pytestmark = pytest.mark.sim


def leftovers(folder):
    return sorted(name for name in os.listdir(folder) if name.startswith(".tmp-"))


def test_a_symlink_is_written_through_and_stays_a_symlink(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old\n")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_json_atomic(link, {"a": 1})
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text()) == {"a": 1}
    assert leftovers(tmp_path) == []


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "sub" / "new.json")
    write_atomic(link, "x\n")
    assert link.is_symlink() and (tmp_path / "sub" / "new.json").read_text() == "x\n"


def test_replacing_a_file_keeps_its_permissions(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("old\n")
    path.chmod(0o640)
    write_atomic(path, "new\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and path.read_text() == "new\n"


def test_a_fifo_is_refused_not_replaced(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="pipe.json is a FIFO"):
        write_atomic(fifo, "x\n")
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert leftovers(tmp_path) == []


def test_a_symlink_to_a_fifo_is_refused_naming_both(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link.json"
    link.symlink_to(fifo)
    with pytest.raises(ValueError, match=r"link.json \(-> .*pipe\) is a FIFO"):
        write_atomic(link, "x\n")
    assert link.is_symlink() and stat.S_ISFIFO(fifo.lstat().st_mode)


def test_a_device_is_refused_without_being_touched():
    before = os.stat("/dev/null")
    with pytest.raises(ValueError, match="/dev/null is a character device"):
        check_destination("/dev/null")
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev


@pytest.mark.parametrize("name", ["folder", "folder/"])
def test_a_folder_is_refused(tmp_path, name):
    (tmp_path / "folder").mkdir()
    with pytest.raises(ValueError, match="is a folder"):
        write_atomic(str(tmp_path / name), "x\n")


def test_a_file_used_as_a_folder_is_refused(tmp_path):
    (tmp_path / "file.json").write_text("{}\n")
    for path in ("file.json/x.json", "file.json/sub/x.json"):
        with pytest.raises(ValueError, match=f"{path}: cannot be written .a file is used there"):
            check_destination(tmp_path / path)


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="no sysfs mounted")
def test_a_folder_where_no_file_can_be_created_is_refused():
    # sysfs refuses to create files, even for root; the check only tries (and fails) to
    with pytest.raises(ValueError, match="/sys/x.json: cannot create a file in /sys"):
        check_destination("/sys/x.json")
    assert not os.path.lexists("/sys/x.json")


@pytest.mark.parametrize("path", ["", "  "])
def test_an_empty_path_is_refused(path):
    with pytest.raises(ValueError, match="output path is empty"):
        check_destination(path)


def test_a_new_path_in_a_new_folder_is_fine_and_nothing_is_created_by_the_check(tmp_path):
    assert check_destination(tmp_path / "a" / "b.json") == str(tmp_path / "a" / "b.json")
    assert os.listdir(tmp_path) == []


# --- reading JSON ------------------------------------------------------------------------------


def test_an_integer_too_large_for_a_float_is_named(tmp_path):
    path = tmp_path / "cost.json"
    path.write_text('{"decode_step_base": 1' + "0" * 400 + "}")
    with pytest.raises(ValueError, match=r"cost.json: not readable JSON \(an integer of 401"):
        read_json(path)


def test_deep_nesting_is_named_not_a_recursion_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="deep.json: nests arrays or objects too deeply"):
        read_json(path)


def test_bytes_that_are_not_utf8_are_named(tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(b'{"x": "\xff"}')
    with pytest.raises(ValueError, match=r"bad.json: not UTF-8 \(byte 0xff at offset 7\)"):
        read_json(path)


@pytest.mark.parametrize(
    ("path", "kind"), [("/dev/zero", "a character device"), ("/tmp", "a folder")]
)
def test_a_special_file_or_folder_is_not_read(path, kind):
    with pytest.raises(ValueError, match=f"{path}: {kind}, not a JSON file"):
        read_json(path, "cost file")


def test_a_fifo_nobody_writes_to_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="pipe.json: a FIFO, not a JSON file"):
        read_json(fifo)


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(_io, "MAX_JSON_BYTES", 1000)
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"pad": "x" * 2000}))
    with pytest.raises(ValueError, match="big.json: over"):
        read_json(path)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="run file '.*nope.json' does not exist"):
        read_json(tmp_path / "nope.json", "run file")


def test_json_numbers_are_written_one_way_and_read_back_in_both_forms():
    import math

    assert [_io.json_number(v) for v in (1.5, math.inf, -math.inf)] == [1.5, "inf", "-inf"]
    assert _io.json_number(math.nan) is None
    nested = _io.json_safe({"a": (math.inf, 2), "b": {"c": -math.inf}}, "doc")
    assert nested == {"a": ["inf", 2], "b": {"c": "-inf"}}
    for value in (0.25, math.inf, -math.inf):
        assert _io.number_from_json(_io.json_number(value), "x") == value
    # documents from before the one convention wrote infinity as null (capacity, fidelity)
    assert _io.number_from_json(None, "max_rate", null=math.inf) == math.inf
    with pytest.raises(ValueError, match="max_rate"):
        _io.number_from_json(None, "max_rate")
    with pytest.raises(ValueError, match="x must be a number"):
        _io.number_from_json("infinity", "x")
