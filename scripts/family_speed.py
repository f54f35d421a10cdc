"""The best NumPy engine against ONNX Runtime on exported files: ``mlexec report --model FILE`` on
each file, one process per file (a file that fails costs only its own row), then one Markdown table.

    python scripts/family_speed.py /tmp/zoo/*.onnx --out reports/families     # run, then the table
    python scripts/family_speed.py --out reports/families                     # the table of what ran

A file whose ``report.json`` is already under ``--out`` is not run again. Each cell is the best
NumPy engine at that batch and ONNX Runtime's time over its time (> 1: ours faster), the median
over interleaved rounds with its interquartile range; "met" when the median is at least
``BAR`` (the issue's "within 1.25x of ONNX Runtime").
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ENGINES = "naive,fused,packed,onednn,onnxruntime"
NUMPY = ("naive", "static", "arena", "fused", "packed", "onednn", "int8")
BAR = 1 / 1.25


def run(path: Path, out: Path, batches: str, rounds: int, engines: str = ENGINES) -> None:
    folder = out / path.stem
    if (folder / "report.json").exists():
        return
    print(f"report: {path.name}", file=sys.stderr, flush=True)
    done = subprocess.run([sys.executable, "-m", "mlexec", "report", "--model", str(path), "--batches", batches,
                           "--engines", engines, "--rounds", str(rounds), "--recheck-rounds", "0",
                           "--out", str(folder)], capture_output=True, text=True)
    folder.mkdir(parents=True, exist_ok=True)
    failed = folder / "failed.txt"           # a rerun that succeeds clears an earlier failure
    if done.returncode:
        failed.write_text(done.stdout[-2000:] + done.stderr[-4000:])
    else:
        failed.unlink(missing_ok=True)


def cell(rows: list[dict]) -> tuple[str, bool]:
    ours = [r for r in rows if r["engine"] in NUMPY and r.get("vs_onnxruntime") is not None and not r["error"]]
    if not ours:            # each NumPy engine's reason (a row over its error bar is not timed)
        why = "; ".join(f"{r['engine']}: {r['error']}" for r in rows if r["engine"] in NUMPY and r["error"])
        return f"no NumPy engine timed{f' ({why})' if why else ''}", False
    best = max(ours, key=lambda r: r["vs_onnxruntime"])
    lo, hi = best["vs_onnxruntime_iqr"]
    return f"{best['engine']} {best['vs_onnxruntime']:.2f}x ({lo:.2f}-{hi:.2f})", best["vs_onnxruntime"] >= BAR


def table(out: Path) -> str:
    lines, cpu, met, total = [], None, 0, 0
    for folder in sorted(p for p in out.iterdir() if p.is_dir()):
        if (folder / "failed.txt").exists():
            lines.append(f"| {folder.name} | report failed: see {folder / 'failed.txt'} | | |")
            continue
        if not (folder / "report.json").exists():
            continue
        report = json.loads((folder / "report.json").read_text())
        cpu = report["cpu"]
        by_batch: dict[int, list[dict]] = {}
        for row in report["rows"]:
            by_batch.setdefault(row["batch"], []).append(row)
        cells = []
        for batch in sorted(by_batch):
            text, ok = cell(by_batch[batch])
            met, total = met + ok, total + 1
            cells.append(f"b{batch}: {text}{'' if ok else ' **below**'}")
        naive = max((r["median_s"] for r in report["rows"] if r["engine"] == "naive"), default=None)
        lines.append(f"| {folder.name} | {' | '.join(cells)} | {'-' if naive is None else f'{naive * 1e3:.2f} ms'} |")
    head = (f"Best NumPy engine, ONNX Runtime's time over its own (> 1: faster), median (IQR) over "
            f"interleaved rounds; {cpu}. Within 1.25x (>= {BAR:.2f}x): {met} of {total} points.\n\n"
            "| file | batch 1 | batch 8 | naive at the largest batch |\n|---|---|---|---|")
    return "\n".join([head, *lines])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--out", type=Path, default=Path("reports/families"))
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--engines", default=ENGINES, help=f"for mlexec report (default {ENGINES}); "
                        "quantized files: int8,onnxruntime")
    args = parser.parse_args(argv)
    for path in args.files:
        run(path, args.out, args.batches, args.rounds, args.engines)
    print(table(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
