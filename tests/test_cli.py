"""The mlexec command line, run as a real subprocess."""
import json
import subprocess
import sys

import pytest

from conftest import FIXTURES, ROOT, subprocess_env


def mlexec(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "mlexec", *args], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=timeout)


def test_analyze_prints_a_table():
    proc = mlexec("analyze", "--input", "1.0, 0.5", "--dim", "64", "--repeat", "3")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("model mlp dim=64 batch=1 input (1, 64) from 2 value(s)")
    rows = {line.split()[0]: line.split() for line in lines if line.split()[:1] in (["naive"], ["static"], ["arena"])
            and "per op" not in line}
    assert set(rows) == {"naive", "static", "arena"}
    assert all(row[-1] == "pass" for row in rows.values())
    assert "naive run, per op" in proc.stdout and "fc1" in proc.stdout


def test_analyze_json_and_input_file(tmp_path):
    data = tmp_path / "data.csv"
    data.write_text("0.5, 1\n-1, 2\n")
    proc = mlexec("analyze", "--input-file", str(data), "--dim", "32", "--batch", "2", "--repeat", "2",
                  "--engines", "naive,arena", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["input"]["values"] == 4 and result["input"]["first_values"] == [0.5, 1.0, -1.0, 2.0]
    assert [e["name"] for e in result["engines"]] == ["naive", "arena"]
    assert result["model"]["input_shape"] == [2, 32]


@pytest.mark.parametrize("args, expected", [
    (["--input", "1, abc"], "expected a number at position 2, got text 'abc'"),
    (["--input", ""], "got empty input"),
    (["--input", "1,,2"], "got an empty value"),
    (["--input", "nan"], "expected a finite number"),
    (["--input", "1", "--batch", "100000"], "expected batch to be an integer in 1..1024"),
    (["--input", "1", "--dim", "100000"], "expected dim to be an integer in 1..4096"),
    (["--input", "1", "--model", "resnet"], "unknown model 'resnet'; expected one of"),
    (["--input", "1", "--engines", "naive,turbo"], "unknown engine 'turbo'"),
    (["--input", "1", "--batch", "x"], "argument --batch: invalid int value: 'x'"),
    (["--input-file", "/nonexistent/data.csv"], "cannot read --input-file"),
    ([], "expected --input or --input-file"),
])
def test_bad_input_exits_2_with_one_line(args, expected):
    proc = mlexec("analyze", "--dim", "32", "--repeat", "1", *args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlexec: error: ") and expected in lines[0], proc.stderr


def test_huge_input_file_exits_2(tmp_path):
    big = tmp_path / "big.csv"
    big.write_text("1.0\n" * 2_600_000)   # ~10 MB
    proc = mlexec("analyze", "--input-file", str(big), "--dim", "32")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "expected at most 1,000,000 bytes of input text" in proc.stderr


def test_history_table_and_charts(tmp_path):
    out = tmp_path / "charts"
    proc = mlexec("history", "--root", str(FIXTURES / "baselines"), "--out", str(out), "--html", str(tmp_path / "site"),
                  "--machine", "Linux-CPython-3.11-64bit")
    assert proc.returncode == 0, proc.stderr
    assert "a1b2c3d4 (2026-01-01) to e5f6a7b8" in proc.stdout
    assert "test_fwd[arena]  latency  b2c3d4e5   c3d4e5f6  505.0 µs → 300.0 µs" in proc.stdout
    assert "other-machine" not in proc.stdout and "Tight layout" not in proc.stderr
    charts = list(out.iterdir())
    assert [p.name for p in charts] == ["Linux-CPython-3.11-64bit_mlp.png"]
    assert charts[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "site" / "index.html").is_file()


def test_history_errors_exit_2(tmp_path):
    proc = mlexec("history", "--root", str(tmp_path))
    assert proc.returncode == 2 and "no readable saved runs" in proc.stderr and "Traceback" not in proc.stderr
    machine = tmp_path / "m1"
    machine.mkdir()
    (machine / "0001_x.json").write_text((FIXTURES / "invalid" / "truncated.json").read_text())
    proc = mlexec("history", "--root", str(tmp_path), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "0001_x.json: invalid JSON (truncated?)" in proc.stderr
