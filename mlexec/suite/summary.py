"""The table that ends a benchmark run: naive vs every other engine, case by case."""
from __future__ import annotations

from engines.ir.models import ABS_TOL

from .grid import HEADLINE
from ..units import fmt_bytes, fmt_time


def rows(results: dict) -> list[dict]:
    """results: {(case_id, engine): {"median": s, "peak": bytes, "held": bytes, "err": float}},
    in the order measured; each case's rows start with naive, the baseline of its ratios."""
    cases = list(dict.fromkeys(case for case, _ in results))
    out = []
    for case_id in cases:
        base = results.get((case_id, "naive"), {})
        engines = sorted((e for c, e in results if c == case_id), key=lambda e: e != "naive")
        for engine in engines:
            r = results[(case_id, engine)]
            speedup = base["median"] / r["median"] if base.get("median") and r.get("median") else None
            saved = ((1 - r["peak"] / base["peak"]) * 100
                     if base.get("peak") and r.get("peak") is not None else None)
            out.append(dict(case=case_id, engine=engine, peak=r.get("peak"), held=r.get("held"),
                            median=r.get("median"), speedup=speedup, saved=saved, err=r.get("err"),
                            tol=r.get("tol", ABS_TOL)))
    return out


def format_table(results: dict) -> str:
    table = rows(results)
    if not table:
        return ""
    head = (f"{'case':28} {'engine':14} {'alloc/fwd':>11} {'held':>11} {'median':>11} {'speedup':>8} "
            f"{'mem saved':>10}  correct")
    lines = [head, "-" * len(head)]
    for r in table:
        speed = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        saved = f"{r['saved']:.1f}%" if r["saved"] is not None else "-"
        err = "-" if r["err"] is None else f"{'yes' if r['err'] < r['tol'] else 'NO'} ({r['err']:.0e})"
        lines.append(f"{r['case']:28} {r['engine']:14} {fmt_bytes(r['peak']):>11} {fmt_bytes(r['held']):>11} "
                     f"{fmt_time(r['median']):>11} "
                     f"{speed:>8} {saved:>10}  {err}")
    lines.append(headline(results))
    return "\n".join(lines)


def headline(results: dict) -> str:
    naive = results.get((HEADLINE.id, "naive"), {}).get("peak")
    best = [(results[k]["peak"], k[1]) for k in results
            if k[0] == HEADLINE.id and k[1] in ("static", "arena") and results[k].get("peak") is not None]
    if not naive or not best:
        return f"headline ({HEADLINE.id}): not measured in this run"
    peak, engine = min(best)
    return (f"headline ({HEADLINE.id}): allocated per forward, naive {fmt_bytes(naive)} -> {engine} "
            f"{fmt_bytes(peak)}, {(1 - peak / naive) * 100:.2f}% saved")
