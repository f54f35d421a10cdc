"""ONNX's backend node tests on every NumPy engine and on ONNX Runtime: the table in docs/importing.md.

    python scripts/conformance_table.py            # print the table (Markdown)
    python scripts/conformance_table.py --write    # and replace it in docs/importing.md

The cases are tests/conformance.py's (the onnx package's node test cases with a float32 first
input and one output, later inputs as initializers). A case passes when it imports and every
NumPy engine (``engines.ENGINES`` without the peers) gives ONNX's expected output at ONNX's
tolerance; ONNX Runtime's count is its CPU provider on the same one-input file, held to the same
check. Per op: cases, passed, refused with the reasons grouped (names and numbers blanked), and
ONNX Runtime's passes. Refusals of an expanded case (``..._expanded``: the op's function body) are
counted under the op it expands.
"""
from __future__ import annotations

import argparse
import platform
import re
import sys
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import numpy as np  # noqa: E402

import conformance  # noqa: E402
from engines import ENGINES, EngineUnavailable, OnnxImportError, load_onnx  # noqa: E402

DOC = ROOT / "docs" / "importing.md"
BEGIN, END = "<!-- conformance table: begin -->", "<!-- conformance table: end -->"
TARGET = 0.70            # of ONNX Runtime's passes: the goal


@dataclass
class OpRow:
    """One op's cases and what became of them."""
    cases: int = 0
    passed: int = 0
    refused: int = 0
    wrong: int = 0
    ort: int = 0
    reasons: Counter = field(default_factory=Counter)


def reason(problem: str) -> str:
    """A refusal's problem with names, numbers and the node prefix blanked, for grouping."""
    text = re.sub(r"^node '[^']*'(?: \([^)]*\))?: ", "", problem)
    text = re.sub(r" \(domain ([\w.]+), opset \d+\)", lambda m: "" if m.group(1) == "ai.onnx" else f" (domain {m.group(1)})", text)
    text = re.sub(r"'[^']*'", "…", text)
    text = re.sub(r"\([^()]*\d[^()]*\)", "(…)", text)
    text = re.sub(r"\b\d+\b", "N", text)
    return text[:140]


def engines_verdict(case, model, engines) -> str | None:
    """None when every engine matches; else the engines that did not."""
    wrong = []
    batch = model.fixed_batch.size if model.fixed_batch else len(case.x)
    for name in engines:
        try:
            with np.errstate(all="ignore"):
                got = ENGINES[name](model, batch).forward(case.x)
        except EngineUnavailable:
            continue
        except Exception as exc:      # noqa: BLE001 - a crash is a wrong result here, reported
            wrong.append(f"{name} ({type(exc).__name__})")
            continue
        if not conformance.matches(case, got):
            wrong.append(name)
    return ", ".join(wrong) or None


def ort_passes(case) -> bool:
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(case.model, options, providers=["CPUExecutionProvider"])
        got = session.run(None, {session.get_inputs()[0].name: case.x})[0]
    except Exception:                 # noqa: BLE001 - anything ONNX Runtime refuses is a fail
        return False
    return conformance.matches(case, got)


def run(progress=None) -> tuple[dict[str, OpRow], list[str]]:
    engines = conformance.float_engines()
    rows: dict[str, OpRow] = defaultdict(OpRow)
    wrong = []
    cases = conformance.cases()
    for i, case in enumerate(cases):
        if progress:
            progress(i + 1, len(cases))
        row = rows[case.op_type]
        row.cases += 1
        row.ort += ort_passes(case)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                model = load_onnx(case.model, name=case.name)
            except OnnxImportError as exc:
                row.refused += 1
                row.reasons.update({reason(p) for p in exc.problems})
                continue
        bad = engines_verdict(case, model, engines)
        if bad:
            row.wrong += 1
            wrong.append(f"{case.name}: {bad}")
        else:
            row.passed += 1
    return dict(rows), wrong


def cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def table(rows: dict[str, OpRow], wrong: list[str]) -> str:
    import onnx
    import onnxruntime
    total = sum(r.cases for r in rows.values())
    passed = sum(r.passed for r in rows.values())
    ort = sum(r.ort for r in rows.values())
    engines = ", ".join(conformance.float_engines())
    lines = [
        f"**{passed} of {total} cases pass on every NumPy engine** ({engines}); ONNX Runtime "
        f"{onnxruntime.__version__} passes {ort}: **{passed / ort:.0%} of ONNX Runtime's count** "
        f"(the goal: {TARGET:.0%}, {int(np.ceil(TARGET * ort))}). Refused: "
        f"{sum(r.refused for r in rows.values())}; imported but wrong on some engine: {len(wrong)}"
        + (f" ({'; '.join(wrong)})" if wrong else "") + ".",
        "",
        f"onnx {onnx.__version__}'s node test cases with a float32 first input, plain-array inputs and one "
        f"output; later inputs made initializers (tests/conformance.py). Tolerance rtol 1e-3, atol 1e-7 "
        f"(ONNX's). Generated by `python scripts/conformance_table.py --write` on {cpu()}.",
        "",
        "| op | cases | passed | refused | ONNX Runtime | why refused (cases) |",
        "|---|---|---|---|---|---|",
    ]
    for op in sorted(rows, key=lambda o: (-(rows[o].cases - rows[o].passed), o)):
        r = rows[op]
        why = "; ".join(f"{text} ({n})" for text, n in r.reasons.most_common())
        lines.append(f"| {op} | {r.cases} | {r.passed} | {r.refused} | {r.ort} | {why.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def write(text: str, path: Path = DOC) -> None:
    doc = path.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{path} has no {BEGIN} ... {END} markers")
    head, rest = doc.split(BEGIN, 1)
    path.write_text(head + BEGIN + "\n" + text + END + rest.split(END, 1)[1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"replace the table in {DOC.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    rows, wrong = run(lambda i, n: print(f"\r{i}/{n}", end="", file=sys.stderr) if i % 50 == 0 else None)
    print(file=sys.stderr)
    text = table(rows, wrong)
    print(text)
    if args.write:
        write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
