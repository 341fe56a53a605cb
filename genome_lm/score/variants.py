"""`genome-lm variants`: the effect of each variant on the model's log-likelihood, by preceding context, and
how well it separates labels (the score, its outputs and exactness: docs/score.md).

Metrics: the predictor is -score (a lower log-likelihood of the alt sequence predicts the positive class).
AUROC and AUPRC come from weighted counts of positives and negatives per distinct predictor value, so one
bootstrap replicate is a weight vector (how often each variant is drawn) and all replicates of all contexts
are matrix work; the paired difference against the shortest context uses the same draws. Ties count half
(AUROC: the Mann-Whitney statistic; AUPRC: average precision with tied values as one threshold, as
scikit-learn computes it).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from genome_lm.errors import GenomeLMError
from genome_lm.eval.stats import DEFAULT_RESAMPLES, DEFAULT_SEED, LEVEL, draws, jfloat, percentile_ci
from genome_lm.genome.fasta import Reference, contig_key
from genome_lm.genome.tokenizer import VOCAB, encode, reverse_complement
from genome_lm.outputs import atomic_directory, claim_output, write_json_atomic
from genome_lm.progress import progress
from genome_lm.score.params import STRANDS, VariantsParams
from genome_lm.score.vcf import Variant, check_against, read_labels_tsv, read_vcf, with_labels

log = logging.getLogger(__name__)
ROC_POINTS = 200


def _inputs(p: VariantsParams) -> tuple[list[Variant], dict, Reference]:
    """The variants to score (REF checked, labelled), what was read and skipped, and the reference."""
    if p.labels and p.labels_tsv:
        raise GenomeLMError("give --labels KEY or --labels-tsv TSV, not both")
    if not Path(p.checkpoint).exists():
        raise GenomeLMError(f"--checkpoint {p.checkpoint} does not exist; point it to a run's checkpoints/last "
                            "or a model directory")
    variants, symbolic = read_vcf(p.vcf, p.labels)
    if p.labels_tsv:
        variants = with_labels(variants, read_labels_tsv(p.labels_tsv))
    if not variants:
        raise GenomeLMError(f"--vcf {p.vcf} holds no variant with base alleles to score")
    ref = Reference.load(p.fasta, {v.chrom for v in variants}, missing_ok=True)
    kept, skipped, listed = check_against(variants, ref)
    if not kept:
        raise GenomeLMError(f"no variant of --vcf {p.vcf} lies on a contig of --fasta {p.fasta} (it has "
                            f"{', '.join(ref.all_names[:8])}); check the assembly and the chromosome names")
    longest = max(len(ref.tokens(c)) for c in {v.chrom for v in kept})
    if max(p.contexts) >= longest:
        raise GenomeLMError(f"--contexts {max(p.contexts)} is not shorter than every contig holding a variant (the "
                            f"longest has {longest:,} bases); give contexts below {longest:,}")
    counts = {"read": len(variants) + symbolic, "scored": len(kept),
              "skipped": {**skipped, "symbolic_allele": symbolic}, "ref_mismatches": listed}
    return kept, counts, ref


def windows(v: Variant, tokens: np.ndarray, L: int, strand: str, after: int):
    """(prefix [<= L], ref continuation, alt continuation) as reference token ids for variant `v` on a
    contig's `tokens`, reading order of `strand`: on '-' the reverse complement of what follows."""
    start, end = v.start, v.start + len(v.ref)
    ref_al, alt_al = encode(v.ref), encode(v.alt)
    if strand == "+":
        prefix, tail = tokens[max(0, start - L):start], tokens[end:end + after]
        return prefix, np.r_[ref_al, tail], np.r_[alt_al, tail]
    rc = reverse_complement
    prefix, tail = rc(tokens[end:end + L]), rc(tokens[max(0, start - after):start])
    return prefix, np.r_[rc(ref_al), tail], np.r_[rc(alt_al), tail]


def _score(model, lut: np.ndarray, ref: Reference, variants: list[Variant], L: int, strand: str, p: VariantsParams,
           bar) -> list[dict]:
    """Rows of `variants` at context L on `strand`; the variants of one locus share a prefix pass."""
    from genome_lm.score.engine import score_continuations

    loci: dict[tuple, list[Variant]] = {}
    for v in variants:
        loci.setdefault((contig_key(v.chrom), v.start if strand == "+" else v.start + len(v.ref)), []).append(v)
    rows = []
    for members in loci.values():
        tokens = ref.tokens(members[0].chrom)
        parts = [windows(v, tokens, L, strand, p.after) for v in members]
        unique = {c.tobytes(): c for _, r, a in parts for c in (r, a)}  # split alleles share their REF
        logps = dict(zip(unique, score_continuations(model, lut[parts[0][0]], [lut[c] for c in unique.values()],
                                                     p.chunk)))
        for k, v in enumerate(members):
            r, a = logps[parts[k][1].tobytes()], logps[parts[k][2].tobytes()]
            rows.append({"chrom": v.chrom, "pos": v.pos, "id": v.id, "ref": v.ref, "alt": v.alt, "kind": v.kind,
                         "context": L, "context_used": len(parts[k][0]), "strand": strand,
                         "score": float(np.nansum(a) - np.nansum(r)), "ref_logp": float(np.nansum(r)),
                         "alt_logp": float(np.nansum(a)), "ref_per_base": r, "alt_per_base": a, "label": v.label})
        bar.update(len(members))
    return rows


def _table(rows: list[dict], both: bool):
    """variants.parquet's table; with `both`, rows of strand 'both' (means of '+' and '-') too."""
    import pyarrow as pa

    if both:
        plus = [r for r in rows if r["strand"] == "+"]
        minus = {(r["chrom"], r["pos"], r["ref"], r["alt"], r["context"]): r for r in rows if r["strand"] == "-"}
        for r in plus:
            m = minus[r["chrom"], r["pos"], r["ref"], r["alt"], r["context"]]
            rows.append({**r, "strand": "both", "context_used": min(r["context_used"], m["context_used"]),
                         **{k: (r[k] + m[k]) / 2 for k in ("score", "ref_logp", "alt_logp")},
                         "ref_per_base": None, "alt_per_base": None})
    f64, i64, s = pa.float64(), pa.int64(), pa.string()
    schema = pa.schema([("chrom", s), ("pos", i64), ("id", s), ("ref", s), ("alt", s), ("kind", s), ("context", i64),
                        ("context_used", i64), ("strand", s), ("score", f64), ("ref_logp", f64), ("alt_logp", f64),
                        ("ref_per_base", pa.list_(pa.float32())), ("alt_per_base", pa.list_(pa.float32())),
                        ("label", f64)])
    return pa.Table.from_pylist(rows, schema=schema)  # per-base log-probs: float32 [n] arrays from the engine


def run_variants(p: VariantsParams, show_progress: bool | None = None) -> dict:
    """Score every variant of `p.vcf` at each of `p.contexts`; write OUT/variants.parquet and OUT/summary.json;
    return the summary."""
    import pyarrow.parquet as pq
    import torch

    from genome_lm.eval.config import resolve_dtype
    from genome_lm.eval.run import checkpoint_record
    from genome_lm.model import build, token_lut

    t0 = time.perf_counter()
    p = p.model_copy(update={"contexts": sorted(set(p.contexts))})
    inputs = [p.checkpoint, p.fasta, p.vcf, *([p.labels_tsv] if p.labels_tsv else [])]
    claim_output(p.out, "variants", inputs, p.overwrite)
    variants, counts, ref = _inputs(p)
    ckpt = checkpoint_record(p.checkpoint)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build(ckpt["model_dir"], dtype=resolve_dtype(p.dtype, device), device=device).model.eval()
    lut = token_lut(VOCAB, ckpt["model_dir"])
    strands = STRANDS[p.strands]
    log.info("variants: %d variants x %d contexts x %d strands, %s", len(variants), len(p.contexts), len(strands),
             ckpt["model_dir"])
    rows: list[dict] = []
    t_score = time.perf_counter()
    with progress(len(variants) * len(p.contexts) * len(strands), desc=f"variants {Path(p.out).name}",
                  unit="variant", disable=show_progress is False) as bar:
        for L in p.contexts:
            for strand in strands:
                rows += _score(model, lut, ref, variants, L, strand, p, bar)
    scored = len(rows) / max(time.perf_counter() - t_score, 1e-9)  # variant x context x strand per second
    table = _table(rows, p.strands == "both")
    strand = "both" if p.strands == "both" else "+"  # the labelled rows of this strand give the metrics
    df = table.select(["context", "strand", "score", "label"]).to_pandas()
    df = df[(df.strand == strand) & df.label.notna()]
    found = None if df.empty else metrics({c: df[df.context == c].score.to_numpy() for c in p.contexts},
                                          df[df.context == p.contexts[0]].label.to_numpy(), strand, p.resamples, p.seed)
    summary = {"command": "variants", "checkpoint": ckpt,
               "reference": {"path": ref.path, "sha256": ref.sha256}, "contexts": p.contexts, "after": p.after,
               "strands": strands + (["both"] if p.strands == "both" else []), "variants": counts,
               "metrics": found, "resamples": p.resamples, "seed": p.seed,
               "seconds": round(time.perf_counter() - t0, 2), "variants_per_second": round(scored, 3)}
    with atomic_directory(p.out, "variants", inputs, p.overwrite) as tmp:
        pq.write_table(table, tmp / "variants.parquet")
        write_json_atomic(tmp / "summary.json", summary)
    return summary


def format_summary(s: dict, out: str) -> str:
    """The printout: what was scored and skipped, then AUROC / AUPRC by context when labelled."""
    v = s["variants"]
    skipped = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in v["skipped"].items() if n) or "none"
    lines = [f"variants: {v['scored']} of {v['read']} scored (skipped: {skipped}) at contexts "
             f"{', '.join(map(str, s['contexts']))}, {s['variants_per_second']:.2f} variant-contexts/s; {out}"]
    if m := s["metrics"]:
        def num(x):
            return "nan" if x is None else f"{x:.3f}"

        def ci(lo_hi):
            return "[" + ", ".join(map(num, lo_hi)) + "]"

        lines.append(f"strand {m['strand']}: {'context':>8} {'pos':>5} {'neg':>5}  AUROC [95% CI]        "
                     "AUPRC [95% CI]        dAUROC vs shortest")
        for b, d in zip(m["by_context"], m["paired_vs_shortest"]):
            lines.append(f"{'':9}{b['context']:>9} {b['n_pos']:>5} {b['n_neg']:>5}  {num(b['auroc'])} "
                         f"{ci(b['auroc_ci']):<15} {num(b['auprc'])} {ci(b['auprc_ci']):<15} "
                         f"{num(d['d_auroc'])} {ci(d['d_auroc_ci'])}")
    return "\n".join(lines)


def _curves(predictor: np.ndarray, y: np.ndarray, w: np.ndarray):
    """Weighted positives and negatives per distinct value, highest first: (P [r, G], N [r, G]) for
    weights `w` [r, n]."""
    order = np.argsort(-predictor, kind="stable")
    p = predictor[order]
    starts = np.flatnonzero(np.r_[True, p[1:] != p[:-1]])  # where each run of equal values begins
    wp, wn = w[:, order] * y[order], w[:, order] * (1 - y[order])
    return np.add.reduceat(wp, starts, axis=1), np.add.reduceat(wn, starts, axis=1)


def auroc_auprc(predictor: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """AUROC [r] and AUPRC [r] of `predictor` [n] for labels `y` [n] (1/0) under weights `w` [r, n]
    (default: each variant once); NaN without a positive or a negative."""
    w = np.ones((1, len(y))) if w is None else w
    P, N = _curves(predictor, y.astype(np.float64), w)
    tp, fp = np.cumsum(P, axis=1), np.cumsum(N, axis=1)
    n_pos, n_neg = tp[:, -1], fp[:, -1]
    with np.errstate(divide="ignore", invalid="ignore"):
        above = fp - N  # negatives ranked strictly above each group
        auroc = (P * (n_neg[:, None] - above - 0.5 * N)).sum(axis=1) / (n_pos * n_neg)
        precision = np.where(tp + fp > 0, tp / (tp + fp), 0.0)
        auprc = (P * precision).sum(axis=1) / n_pos
    bad = (n_pos == 0) | (n_neg == 0)
    return np.where(bad, np.nan, auroc), np.where(bad, np.nan, auprc)


def roc_points(predictor: np.ndarray, y: np.ndarray, points: int = ROC_POINTS) -> dict:
    """{"fpr": [...], "tpr": [...]} from (0, 0) to (1, 1), at most about `points` points."""
    P, N = _curves(predictor, y.astype(np.float64), np.ones((1, len(y))))
    tpr = np.r_[0.0, np.cumsum(P[0]) / max(P.sum(), 1)]
    fpr = np.r_[0.0, np.cumsum(N[0]) / max(N.sum(), 1)]
    keep = np.unique(np.linspace(0, len(tpr) - 1, min(points, len(tpr))).round().astype(int))
    return {"fpr": [round(float(x), 5) for x in fpr[keep]], "tpr": [round(float(x), 5) for x in tpr[keep]]}


def metrics(scores: dict[int, np.ndarray], y: np.ndarray, strand: str, resamples: int = DEFAULT_RESAMPLES,
            seed: int = DEFAULT_SEED) -> dict:
    """summary.json's "metrics" for `scores` {context: score [n]} of n labelled variants `y` [n] (the same
    variants at every context, in one order): AUROC, AUPRC with CIs per context, their paired difference
    against the shortest context, ROC points and the score shift."""
    contexts = sorted(scores)
    preds = [-np.asarray(scores[c], dtype=np.float64) for c in contexts]
    point = np.array([auroc_auprc(p, y) for p in preds])[:, :, 0]  # [C, 2]
    n = len(y)
    rep = np.concatenate([np.stack([np.stack(auroc_auprc(p, y, w), axis=1) for p in preds], axis=1)
                          for w in draws(n, resamples, seed)])  # [R, C, 2]; w [r, n]: each variant's draws
    usable = min(int(y.sum()), int(n - y.sum())) >= 2
    lo, hi = percentile_ci(rep.reshape(len(rep), -1), usable, LEVEL)
    dlo, dhi = percentile_ci((rep - rep[:, :1]).reshape(len(rep), -1), usable, LEVEL)
    lo, hi, dlo, dhi = (a.reshape(len(contexts), 2) for a in (lo, hi, dlo, dhi))
    by, paired, roc, shift = [], [], [], []
    for k, c in enumerate(contexts):
        s = np.asarray(scores[c], dtype=np.float64)
        by.append({"context": c, "n_pos": int(y.sum()), "n_neg": int(n - y.sum()), "auroc": jfloat(point[k, 0]),
                   "auroc_ci": [jfloat(lo[k, 0]), jfloat(hi[k, 0])], "auprc": jfloat(point[k, 1]),
                   "auprc_ci": [jfloat(lo[k, 1]), jfloat(hi[k, 1])]})
        d = point[k] - point[0]
        paired.append({"context": c, "d_auroc": jfloat(d[0]), "d_auroc_ci": [jfloat(dlo[k, 0]), jfloat(dhi[k, 0])],
                       "d_auprc": jfloat(d[1]), "d_auprc_ci": [jfloat(dlo[k, 1]), jfloat(dhi[k, 1])]})
        roc.append({"context": c, **roc_points(preds[k], y)})
        shift.append({"context": c, "mean_score": jfloat(s.mean()),
                      **{f"mean_score_{k}": jfloat(s[y == v].mean()) if (y == v).any() else None
                         for k, v in (("pos", 1), ("neg", 0))}})
    return {"strand": strand, "by_context": by, "paired_vs_shortest": paired, "roc": roc, "score_shift": shift}


def variants_command(p: VariantsParams) -> str:
    return format_summary(run_variants(p), p.out)
