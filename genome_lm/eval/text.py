"""What `genome-lm eval` (`format_summary`) and `genome-lm compare` (`format_table`) print: fixed-width
tables from summary.json and compare.json, each number beside the count of tokens it rests on."""

from __future__ import annotations


def _num(x, spec: str, width: int = 0) -> str:
    return f"{'-' if x is None else format(x, spec):>{width}}"


def strata_rows(result: dict) -> list[tuple[str, dict]]:
    """(label, table) for every class of every stratum in a summary or compare result."""
    rows = [(f"{section} {label}", table) for section in ("repeat", "leakage")
            for label, table in (result.get(section) or {}).items()]
    for name, classes in (result.get("annotations") or {}).items():
        rows.extend((f"{name} {label}", classes[label]) for label in ("in", "out") if label in classes)
    return rows


def absent_lines(result: dict) -> list[str]:
    return [f"no {key} split: {why}" for key, why in (result.get("strata_absent") or {}).items()]


def format_summary(summary: dict, out: str | None = None) -> str:
    """An eval's summary as text."""
    o = summary["overall"]
    lines = [f"{f'{out}: ' if out else ''}{o['n_tokens']:,} tokens, mean NLL {_num(o['mean_nll'], '.4f')} nats/token = "
             f"{_num(o['bits_per_base'], '.4f')} bits/base ("
             + ("no 95% CI: it needs at least 2 windows" if o["ci_low"] is None or o["ci_high"] is None
                else f"95% CI {o['ci_low']:.4f}-{o['ci_high']:.4f} nats") + ")"]
    rows = strata_rows(summary)
    if rows:
        lines.append(f"{'':>22} {'tokens':>12} {'windows':>7} {'nats':>8} {'bits/base':>9} {'95% CI (nats)':>17}")
        lines += [_summary_row(label, t["overall"]) for label, t in rows]
    lines += absent_lines(summary)
    lines += strand_lines(summary.get("strands"))
    lines += ablation_lines(summary.get("context_ablation"))
    return "\n".join(lines)


STRAND_LABELS = {"forward": "forward strand", "reverse": "reverse complement", "average": "both strands"}
COMPARE_HEAD = f"{'tokens':>10} {'A nats':>8} {'B nats':>8} {'B-A':>8} {'rel %':>7} {'95% CI (%)':>17}"


def _summary_row(label: str, e: dict) -> str:
    return (f"{label:>22} {e['n_tokens']:>12,} {e['n_windows']:>7} {_num(e['mean_nll'], '.4f', 8)} "
            f"{_num(e['bits_per_base'], '.4f', 9)} {_ci(e['ci_low'], e['ci_high'], '.4f'):>17}")


def strand_lines(strands: dict | None) -> list[str]:
    """--strands both: each strand's and the pooled mean NLL, and the per-base agreement."""
    if not strands:
        return []
    lines = ["strands (the lines above: forward strand):"]
    lines += [_summary_row(label, strands[key]["overall"]) for key, label in STRAND_LABELS.items()]
    g = strands["agreement"]["overall"]
    lines.append(f"strand agreement over {g['n_tokens']:,} bases scored on both strands: Pearson r "
                 f"{_num(g['pearson_r'], '.3f')} {_ci(g['pearson_ci_low'], g['pearson_ci_high'], '.3f')}, mean |delta| "
                 f"{_num(g['mean_abs_diff'], '.4f')} nats {_ci(g['abs_diff_ci_low'], g['abs_diff_ci_high'], '.4f')}, "
                 f"forward - reverse {_num(g['mean_diff'], '+.4f')} nats (contexts differ: before vs after each base)")
    return lines


def _ci(lo, hi, spec: str) -> str:
    return f"[{_num(lo, spec)}, {_num(hi, spec)}]"


def ablation_lines(abl: dict | None) -> list[str]:
    """An eval's context ablation: mean NLL per L and the paired step from the L before."""
    if not abl:
        return []
    lines = [f"context ablation: {abl['target_tokens']:,} target tokens ({abl['targets']}) in {abl['n_windows']} "
             f"window(s) ({abl['windows_left_out']} left out: too short), each scored given exactly L preceding tokens",
             f"{'L':>10} {'nats':>8} {'bits/base':>9} {'95% CI (nats)':>17} {'vs previous L':>13} {'95% CI':>19}"]
    steps = _steps(abl["paired_differences"], "mean_delta", 13)
    lines += [f"{e['L']:>10,} {_num(e['mean_nll'], '.4f', 8)} {_num(e['bits_per_base'], '.4f', 9)} "
              f"{_ci(e['ci_low'], e['ci_high'], '.4f'):>17} {steps.get(e['L'], '')}".rstrip() for e in abl["by_length"]]
    return lines


def _steps(diffs: list[dict], key: str, width: int) -> dict[int, str]:
    """{L: "delta [ci]"} of the steps into each L (`to`)."""
    return {d["to"]: f"{_num(d[key], '+.4f', width)} {_ci(d['ci_low'], d['ci_high'], '+.4f'):>19}" for d in diffs}


def compare_ablation_lines(abl: dict | None) -> list[str]:
    """Both models' ablation side by side, B - A at each L, and B's step minus A's."""
    if not abl:
        return []
    if "absent" in abl:
        return [f"no context ablation comparison: {abl['absent']}"]
    lines = [f"context ablation: {abl['target_tokens']:,} target tokens in {abl['n_windows']} window(s) scored "
             "by both, each given exactly L preceding tokens",
             f"{'L':>10} {'A nats':>8} {'B nats':>8} {'B-A':>8} {'rel %':>7} {'95% CI (%)':>17} "
             f"{'B-A step':>9} {'95% CI':>19}"]
    steps = _steps(abl["gain_difference"], "diff", 9)
    lines += [f"{e['L']:>10,} {_num(e['mean_nll_a'], '.4f', 8)} {_num(e['mean_nll_b'], '.4f', 8)} "
              f"{_num(e['diff'], '+.4f', 8)} {_num(e['rel_change_pct'], '+.2f', 7)} "
              f"{_ci(e['rel_ci_low'], e['rel_ci_high'], '+.2f'):>17} {steps.get(e['L'], '')}".rstrip()
              for e in abl["difference"]]
    lines.append("(B-A step: B's change from the previous L minus A's; negative: B gains more from the added context)")
    return lines


def _compare_row(label: str, e: dict, share: bool = True) -> str:
    row = (f"{label:>17} {e['n_tokens']:>10,} {_num(e['mean_nll_a'], '.4f', 8)} {_num(e['mean_nll_b'], '.4f', 8)} "
           f"{_num(e['diff'], '+.4f', 8)} {_num(e['rel_change_pct'], '+.2f', 7)} "
           f"{_ci(e['rel_ci_low'], e['rel_ci_high'], '+.2f'):>17}")
    gain = "" if e.get("gain_share") is None else f"{100 * e['gain_share']:5.1f}%"
    return f"{row} {gain:>6}" if share else row


def format_table(result: dict) -> str:
    """The comparison as a fixed-width text table (printed by the CLI)."""
    lines = [f"A = {result['a']['dir']}", f"B = {result['b']['dir']}",
             f"{'context':>17} {COMPARE_HEAD} {'share':>6}"]
    lines += [_compare_row(f"[{bk['lo']:,}, {bk['hi']:,})", bk) for bk in result["buckets"] if bk["n_tokens"]]
    lines.append(_compare_row("all", result["overall"]))
    lines += [_compare_row(label, t["overall"]) for label, t in strata_rows(result)]
    st = result.get("strands")
    if st and "absent" in st:
        lines.append(f"no strand comparison: {st['absent']}")
    elif st:
        lines += [_compare_row(label.replace("reverse complement", "rev. complement"), st[key]["overall"])
                  for key, label in STRAND_LABELS.items()]
        if "agreement" in st:  # compare.json written before it carried the agreement has none
            ga, gb = st["agreement"]["a"], st["agreement"]["b"]
            lines.append(f"strand agreement (per-base Pearson r): A {_num(ga['pearson_r'], '.3f')} "
                         f"{_ci(ga['pearson_ci_low'], ga['pearson_ci_high'], '.3f')}, B {_num(gb['pearson_r'], '.3f')} "
                         f"{_ci(gb['pearson_ci_low'], gb['pearson_ci_high'], '.3f')}")
    c = result["concentration"]["largest_relative_gain"]
    if c:
        lines.append(f"largest relative change: context [{c['lo']:,}, {c['hi']:,}) {c['rel_change_pct']:+.2f}% "
                     f"(95% CI {_num(c['rel_ci_low'], '+.2f')} to {_num(c['rel_ci_high'], '+.2f')})")
    lines += absent_lines(result)
    lines += compare_ablation_lines(result.get("context_ablation"))
    lines += replicate_lines(result.get("replicates"))
    return "\n".join(lines)


def replicate_lines(rep: dict | None, pooled_above: bool = True) -> list[str]:
    """compare with replicates: each pair's overall change, their spread, and the pooled change with CIs
    over seeds and windows. `pooled_above`: the lines follow the pooled tables and say so."""
    if not rep:
        return []
    abl = rep.get("context_ablation")
    span = f" {'A span':>8} {'B span':>8}" if abl else ""
    above = ("; the tables above pool them (each token's NLL averaged over a side's replicates), with CIs over "
             "windows only") if pooled_above else ""
    spans = (f"; span: the ablation's change from L {abl['from']:,} to {abl['to']:,} (nats)") if abl else ""
    lines = [f"replicates: {rep['n']} pairs (replicate i of A vs replicate i of B){above}{spans}",
             f"{'pair':>17} {COMPARE_HEAD}{span}"]
    for i, p in enumerate(rep["pairs"], 1):
        deltas = [p["ablation_span"][k]["mean_delta"] for k in "ab"] if abl and "ablation_span" in p else []
        lines.append(_compare_row(str(i), p, share=False) + "".join(f" {_num(d, '+.4f', 8)}" for d in deltas))
    s, o = rep["spread"]["rel_change_pct"], rep["overall"]
    lines.append(f"spread of rel % over the pairs: mean {_num(s['mean'], '+.2f')}, sd {_num(s['sd'], '.2f')}, "
                 f"min {_num(s['min'], '+.2f')}, max {_num(s['max'], '+.2f')}; {s['negative']} of {rep['n']} negative")
    lines.append(f"pooled, with 95% CIs over pairs and then windows: B-A {_num(o['diff'], '+.4f')} nats "
                 f"{_ci(o['diff_ci_low'], o['diff_ci_high'], '+.4f')}, {_num(o['rel_change_pct'], '+.2f')}% "
                 f"{_ci(o['rel_ci_low'], o['rel_ci_high'], '+.2f')}")
    if abl:
        a, b, g = abl["a"], abl["b"], abl["gain_difference"]
        lines.append(f"ablation span L {abl['from']:,} -> {abl['to']:,} ({abl['target_tokens']:,} targets), pooled, "
                     f"95% CIs over pairs and windows: A {_num(a['mean_delta'], '+.4f')} "
                     f"{_ci(a['ci_low'], a['ci_high'], '+.4f')}, B {_num(b['mean_delta'], '+.4f')} "
                     f"{_ci(b['ci_low'], b['ci_high'], '+.4f')}, B-A {_num(g['diff'], '+.4f')} "
                     f"{_ci(g['ci_low'], g['ci_high'], '+.4f')} nats")
    return lines
