"""Sweep spec files a user got wrong: each is one line naming the file and the problem, exit 2, and
nothing runs (no traceback, no sweep folder)."""
from __future__ import annotations

import pytest

from workbench import cli

BAD_SPECS = [  # (file name, content, words the one line must hold)
    ("bad.yaml", "name: [x\n  y: :\n", ["not valid YAML", "line 2"]),
    ("bad.json", '{"name": "x",', ["not valid JSON", "line 1"]),
    ("binary.yaml", b"\xff\xfe\x00\x1b[2J", ["not UTF-8 text"]),
    ("list.yaml", "- hidden\n- seq_len\n", ["expected a mapping", "got list"]),
    ("scalar.yaml", "just words\n", ["expected a mapping", "got str"]),
    ("set.yaml", "name: s\nset: [1, 2]\ngrid: {seq_len: [128]}\n", ["`set` must be a mapping"]),
    ("grid.yaml", "name: s\ngrid: [hidden, seq_len]\n", ["`grid` must be a mapping"]),
    ("name.yaml", "name: {a: 1}\ngrid: {seq_len: [128]}\n", ["`name` must be a text"]),
    ("preset.yaml", "name: s\npreset: [large]\ngrid: {seq_len: [128]}\n", ["`preset` must be a text"]),
    ("setkey.yaml", "name: s\nset: {1: 2}\ngrid: {seq_len: [128]}\n", ["names must be texts", "1"]),
    ("linked.yaml", "name: s\ngrid: {size: [{1: 2}]}\n", ["names must be texts"]),
    ("value.yaml", "name: s\ngrid: {hidden: [abc]}\n", ["hidden", "abc"]),
]


@pytest.mark.parametrize("name,content,words", BAD_SPECS, ids=[s[0] for s in BAD_SPECS])
def test_a_malformed_spec_file_is_one_line_and_exit_2(tmp_path, capsys, name, content, words):
    spec = tmp_path / name
    spec.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "sweeps"
    assert cli.main(["sweep", str(spec), "--out", str(out), "--no-report"]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    (line,) = captured.err.strip().splitlines()
    for w in words:
        assert w in line, line
    assert not out.exists()  # nothing ran


def test_a_missing_spec_file_is_one_line(tmp_path, capsys):
    assert cli.main(["sweep", str(tmp_path / "nope.yaml"), "--out", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "nope.yaml: cannot read it (No such file or directory)" in line


def test_a_damaged_stored_spec_is_one_line_on_resume(tmp_path, capsys):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "sweep.json").write_text('{"name": "s", "grid": ')  # cut off
    assert cli.main(["sweep", "--name", "s", "--out", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "sweep.json: not valid JSON" in line
