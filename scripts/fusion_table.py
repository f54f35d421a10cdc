"""What the importer's passes make of every model we have, and what importing it costs: a Markdown table.

    python scripts/export_zoo.py --keep /tmp/zoo          # the exported families, once
    python scripts/fusion_table.py --exports /tmp/zoo --cnns           # this tree
    python scripts/fusion_table.py --exports /tmp/zoo --cnns --before HEAD~3   # before / after
    python scripts/fusion_table.py --exports /tmp/zoo --before REV --paths engines/importer/passes.py
    python scripts/fusion_table.py --exports /tmp/zoo --onnxscript    # and onnxscript's rewriter on each file

Models: the ``.onnx`` files in ``--exports`` (``scripts/export_zoo.py --keep``), the graphs and
torch exports of tests/test_onnx_import.py, and with ``--cnns`` the onnx package's light CNNs
(random weights; ``--big`` adds AlexNet, VGG-19 and ZFNet-512).

Per model: the IR op count after the passes, the fused kinds (``attn`` counts ``attn_scores`` and
``attention``,
``ln`` ``layernorm``, ``rms`` ``rmsnorm``, ``gelu`` ``gelu`` and ``gelu_erf``, ``conv+`` the convolutions that took a
batch norm, an affine, an activation, a residual add or a pool), the generic kinds left around a
softmax and GPT-2's GELU (``matmul``, ``isnan``, ``where``, ``tanh``), and the import time:
``load_onnx(passes=False)`` plus the passes, the median over ``--rounds`` rounds.

With ``--before REV`` the tree at REV (``git archive``; with ``--paths``, this tree with only those
files from REV) is measured beside a copy of this tree taken at the start, each round running both
trees one after the other in fresh processes, in alternating order, so that load on the machine
falls on both alike. ``--onnxscript`` adds what onnxscript's optimizer and fusion rules
(``onnxscript.rewriter.ort_fusions``, ``rules.common``) cost and recognise on the same files.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FUSED = ("attn_scores", "attention", "layernorm", "rmsnorm", "gelu", "gelu_erf", "linear")
CONV_KINDS = ("conv", "conv_add", "conv_maxpool")
GENERIC = ("matmul", "isnan", "where", "tanh", "batchnorm")
CNNS = ("densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet")
BIG = ("bvlc_alexnet", "vgg19", "zfnet512")


def collect(args, folder: Path) -> list[tuple[str, Path, int | None]]:
    """(name, file, random weights seed) of every model, its bytes written into ``folder``."""
    sys.path[:0] = [str(ROOT)]
    import onnx
    warnings.simplefilter("ignore")
    from tests import test_onnx_import as t
    models = []
    with contextlib.redirect_stdout(io.StringIO()):          # the dynamo exporter's progress lines
        exported = t._torch_exports()
    for name, data in {**t.GRAPHS, **exported}.items():
        path = folder / f"{name}.onnx"
        path.write_bytes(data)
        models.append((f"tests: {name}", path, None))
    if args.exports:
        models += [(f"zoo: {p.stem}", p, None) for p in sorted(Path(args.exports).glob("*.onnx"))]
    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    for name in (CNNS if args.cnns else ()) + (BIG if args.big else ()):
        models.append((f"cnn: {name}", light / f"light_{name}.onnx", 17))
    return models


def worker(spec: str) -> None:
    """Import each model of ``spec`` (a JSON file) once with this tree's engines; JSON lines out."""
    from engines import load_onnx
    from engines.importer.passes import PASSES
    warnings.simplefilter("ignore")
    models = json.loads(Path(spec).read_text())
    load_onnx(models[0][1], randomize_weights=models[0][2])     # the lazy imports, before any timing
    for name, path, seed in models:
        try:
            t0 = time.perf_counter()
            model = load_onnx(path, passes=False, randomize_weights=seed)
            t1 = time.perf_counter()
            for p in PASSES:
                model = p(model)
            t2 = time.perf_counter()
        except Exception as exc:            # refused or broken in this tree: said so in the table
            print(json.dumps({"name": name, "error": f"{type(exc).__name__}: {str(exc)[:120]}"}), flush=True)
            continue
        kinds: dict[str, int] = {}
        for op in model.ops:
            kinds[op.kind] = kinds.get(op.kind, 0) + 1
        conv_plus = sum(1 for op in model.ops if op.kind in CONV_KINDS and
                        (op.kind != "conv" or op.attrs.get("activation", "none") != "none" or
                         any(p.endswith((".bn", ".mul", ".add")) for p in op.params)))
        print(json.dumps({"name": name, "ops": len(model.ops), "kinds": kinds, "conv_plus": conv_plus,
                          "load": t1 - t0, "passes": t2 - t1}), flush=True)


def onnxscript_rows(models, rounds: int) -> dict[str, str]:
    """Per file: onnxscript's own pipeline for ONNX Runtime (``ort_fusions.fuse_xformers``: its
    optimizer, constant folding and shape arithmetic, then every fusion rule), and its pattern rules
    alone on the file as exported (SDPA, GELU in tanh and erf form, skip LayerNorm; batch norm,
    conv affine and HardSwish from ``rules.common``): median ms and what each recognised."""
    import logging
    logging.disable(logging.WARNING)
    t0 = time.perf_counter()
    import onnx
    import onnx_ir as ir
    from onnxscript.rewriter import RewriteRuleSet
    from onnxscript.rewriter.ort_fusions import _core, erfgelu, gelu, sdpa, skip_normalization
    from onnxscript.rewriter.rules.common import _fuse_batchnorm, _fuse_conv_affine, _fuse_hardswish
    rows = {"": f"import onnxscript and its rules: {(time.perf_counter() - t0) * 1e3:.0f} ms"}
    common = [*_fuse_batchnorm.rules.rules, *_fuse_hardswish.fuse_hardswish_rules().rules,
              _fuse_conv_affine.affine_conv_fusion_rule, _fuse_conv_affine.conv_affine_fusion_rule]
    rules = {"sdpa": sdpa.fuse_sdpa, "gelu": gelu.fuse_gelu, "erfgelu": erfgelu.fuse_erfgelu,
             "skip_ln": skip_normalization.fuse_skip_layer_normalization,
             "bn/affine/hardswish": RewriteRuleSet(common).apply_to_model}
    for name, path, _ in models:
        proto = onnx.load(str(path))
        full, alone = [], []
        for _ in range(rounds):
            model = ir.serde.deserialize_model(proto)
            t = time.perf_counter()
            try:
                with contextlib.redirect_stdout(io.StringIO()):     # it prints graphs it fails on
                    model, counts = _core.fuse_xformers(model)
            except Exception as exc:         # its own failure, said so
                counts = {f"fails: {type(exc).__name__}": 1}
            full.append(time.perf_counter() - t)
            model = ir.serde.deserialize_model(proto)
            t = time.perf_counter()
            found = {}
            for rule, fn in rules.items():
                try:
                    with contextlib.redirect_stdout(io.StringIO()):
                        found[rule] = fn(model)
                except Exception as exc:
                    found[f"{rule} fails ({type(exc).__name__})"] = 1
            alone.append(time.perf_counter() - t)
        said = lambda c: ", ".join(f"{k} {v}" for k, v in c.items() if v) or "nothing"   # noqa: E731
        rows[name] = f"{ms(full)}: {said(counts)} | {ms(alone)}: {said(found)}"
    return rows


def run_tree(tree: Path, spec: Path) -> dict[str, dict]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "fusion_table.py"), "--worker", str(spec)],
                         cwd=tree, env=env, capture_output=True, text=True, check=True).stdout
    return {r["name"]: r for r in map(json.loads, out.splitlines())}


def fused(r: dict) -> str:
    if "error" in r:
        return r["error"]
    k = r["kinds"]
    parts = [f"attn {k.get('attn_scores', 0) + k.get('attention', 0)}", f"ln {k.get('layernorm', 0)}",
             f"gelu {k.get('gelu', 0) + k.get('gelu_erf', 0)}"]
    if k.get("rmsnorm"):
        parts.append(f"rms {k['rmsnorm']}")
    if r["conv_plus"]:
        parts.append(f"conv+ {r['conv_plus']}")
    left = [f"{g} {k[g]}" for g in GENERIC if k.get(g)]
    return ", ".join(parts) + (f"; left: {', '.join(left)}" if left else "")


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:,.1f}" if values else "-"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exports", help="a folder of exported .onnx files (scripts/export_zoo.py --keep)")
    parser.add_argument("--cnns", action="store_true", help="the onnx package's light CNNs (random weights)")
    parser.add_argument("--big", action="store_true", help="and AlexNet, VGG-19, ZFNet-512")
    parser.add_argument("--before", help="a git revision to measure beside this tree, interleaved")
    parser.add_argument("--paths", nargs="+", help="with --before: only these files from REV, the rest this tree's")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--onnxscript", action="store_true",
                        help="also onnxscript's optimizer and fusion rules on each file: cost and matches")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        models = collect(args, folder)
        spec = folder / "models.json"
        spec.write_text(json.dumps([(n, str(p), s) for n, p, s in models]))
        trees = {"after": ROOT}
        if args.before:
            base = folder / "before"
            base.mkdir()
            if args.paths:                    # this tree, with only these files as they were at REV
                for sub in ("engines", "scripts"):
                    shutil.copytree(ROOT / sub, base / sub, ignore=shutil.ignore_patterns("__pycache__"))
                for path in args.paths:
                    (base / path).write_bytes(subprocess.run(["git", "show", f"{args.before}:{path}"], cwd=ROOT,
                                                             capture_output=True, check=True).stdout)
            else:
                archive = subprocess.run(["git", "archive", args.before, "engines", "scripts"], cwd=ROOT,
                                         capture_output=True, check=True).stdout
                subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
            (base / "scripts" / "fusion_table.py").write_text(Path(__file__).read_text())
            after = folder / "after"              # frozen too: the tree may change while this runs
            for sub in ("engines", "scripts"):
                shutil.copytree(ROOT / sub, after / sub, ignore=shutil.ignore_patterns("__pycache__"))
            trees = {"before": base, "after": after}
        runs: dict[str, list[dict]] = {side: [] for side in trees}
        for i in range(args.rounds):              # the order alternates: neither side always goes first
            for side, tree in (list(trees.items()) if i % 2 == 0 else list(trees.items())[::-1]):
                runs[side].append(run_tree(tree, spec))
        print_table(models, runs, args)
        if args.onnxscript:
            rows = onnxscript_rows(models, args.rounds)
            print(f"\nonnxscript on the same files ({rows.pop('')}); median ms over {args.rounds} rounds\n")
            print("| model | optimizer + ort_fusions (ms: fusions) | pattern rules alone (ms: matches) |\n"
                  "|---|---|---|")
            for name, row in rows.items():
                print(f"| {name} | {row} |")
    return 0


def print_table(models, runs, args) -> None:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    load = os.getloadavg()[0]
    print(f"{args.rounds} rounds on {cpu} ({os.cpu_count()} cores), load average {load:.1f} at the end; "
          f"import = load_onnx(passes=False) + the passes, median ms\n")
    sides = list(runs)
    head = ["model", "IR ops"] + [f"fused ({s})" for s in sides] + [f"import ms ({s})" for s in sides] + \
        [f"passes ms ({s})" for s in sides]
    if len(sides) == 2:
        head[1] = "IR ops (before / after)"
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name, _, _ in models:
        first = {s: runs[s][0].get(name, {"error": "missing"}) for s in sides}
        ops = " / ".join(str(first[s].get("ops", "-")) for s in sides)
        cells = [name, ops] + [fused(first[s]) for s in sides]
        cells += [ms([r[name]["load"] + r[name]["passes"] for r in runs[s] if "load" in r.get(name, {})])
                  for s in sides]
        cells += [ms([r[name]["passes"] for r in runs[s] if "passes" in r.get(name, {})]) for s in sides]
        print("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
