"""How long an engine takes to build from an empty kernel cache: each (engine, model point) in a
new process with a new cache directory, build and first forward timed, and the seconds its
kernel choices spent measuring (``report()["kernels"][i]["tuning_s"]``, onednn's thread judge
included where it ran). Prints a Markdown table; the CPU is named.

    python scripts/tuning_time.py [ENGINES] [POINTS]
    python scripts/tuning_time.py fused,packed,onednn mlp:8x256,mlp:128x1024,mlp:8x4096,transformer:8x256x64
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES = "fused,packed,onednn"
POINTS = "mlp:8x256,mlp:128x1024,mlp:1x4096,mlp:8x4096,mlp:128x4096,transformer:8x256x64,transformer:8x512x128"

CHILD = """
import json, sys, time
t0 = time.perf_counter()
from engines import ENGINES, MODELS
name, model_name, batch, dims = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
model = MODELS[model_name](**dims)
t1 = time.perf_counter()
engine = ENGINES[name](model, batch)
engine.forward(model.random_input(batch, 0))
t2 = time.perf_counter()
report = engine.report()
measuring = sum(k.get("tuning_s", 0) for k in report.get("kernels", []))
print(json.dumps({"build_s": t2 - t1, "measuring_s": measuring, "import_s": t1 - t0}))
"""


def point(text: str) -> tuple[str, int, dict]:
    """mlp:BxD or transformer:BxDxS -> (model, batch, its builder's keyword arguments)."""
    model, shape = text.split(":")
    batch, dim, *seq = map(int, shape.split("x"))
    return model, batch, {"dim": dim, **({"seq": seq[0]} if seq else {})}


def measure(engine: str, model: str, batch: int, dims: dict) -> dict:
    env = {**os.environ, "MLEXEC_CACHE_DIR": tempfile.mkdtemp(prefix="mlexec-tuning-"), "MLEXEC_TUNE": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, engine, model, str(batch), json.dumps(dims)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    engines = (argv[0] if argv else ENGINES).split(",")
    points = (argv[1] if len(argv) > 1 else POINTS).split(",")
    sys.path.insert(0, str(ROOT))
    from engines.kernels import cpu_model
    print(f"Build and first forward from an empty kernel cache, each in a new process, seconds "
          f"(seconds measuring kernels in brackets); {cpu_model()}.\n")
    print("| point | " + " | ".join(engines) + " |\n|---|" + "---|" * len(engines))
    for text in points:
        model, batch, dims = point(text)
        cells = []
        for engine in engines:
            r = measure(engine, model, batch, dims)
            cells.append(r["error"] if "error" in r else f"{r['build_s']:.2f} ({r['measuring_s']:.2f})")
        print(f"| {text} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
