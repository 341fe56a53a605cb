"""`genome-lm variants`: the effect of each variant on the model's log-likelihood, by preceding context.

    summary = run_variants(VariantsParams(checkpoint=..., fasta=..., vcf=..., contexts=[1024, 8192], out=...))

The score of a variant at context L on '+': log P(alt + after) - log P(ref + after), summed over the
variant's bases and the `after` reference bases that follow it, given exactly the L bases before it
(fewer near a contig start: `context_used`). On '-' the reverse complement is scored, so the L bases
after the variant are its context. Variants of one locus (same context bases) share one prefix pass
(`variant_engine`). Writes OUT/variants.parquet (one row per variant x context x strand; strand 'both'
is the mean of '+' and '-') and OUT/summary.json, with AUROC/AUPRC by context when labels are given.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from genome_lm.errors import GenomeLMError
from genome_lm.genome.tokenizer import VOCAB, encode, reverse_complement
from genome_lm.outputs import atomic_directory, claim_output, write_json_atomic
from genome_lm.progress import progress
from genome_lm.score.reference import Reference, contig_key
from genome_lm.score.variant_params import VariantsParams
from genome_lm.score.vcf import Variant, check_against, read_labels_tsv, read_vcf, with_labels

log = logging.getLogger(__name__)
PER_VARIANT = ["chrom", "pos", "id", "ref", "alt", "kind"]


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
    from genome_lm.score.variant_engine import score_continuations

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
    cols = {name: [r[name] for r in rows] for name in schema.names}
    for name in ("ref_per_base", "alt_per_base"):
        cols[name] = [None if x is None else np.asarray(x, np.float32) for x in cols[name]]
    return pa.table(cols, schema=schema)


def _metrics(table, contexts: list[int], p: VariantsParams) -> dict | None:
    """summary.json's "metrics" from the labelled rows (strand 'both' when scored, else '+'), or None."""
    from genome_lm.score.variant_stats import metrics

    strand = "both" if p.strands == "both" else "+"
    df = table.select(["context", "strand", "score", "label"]).to_pandas()
    df = df[(df.strand == strand) & df.label.notna()]
    if df.empty:
        return None
    scores = {c: df[df.context == c].score.to_numpy() for c in contexts}
    return metrics(scores, df[df.context == contexts[0]].label.to_numpy(), strand, p.resamples, p.seed)


def run_variants(p: VariantsParams, show_progress: bool | None = None) -> dict:
    """Score every variant of `p.vcf` at each of `p.contexts`; write OUT/variants.parquet and OUT/summary.json;
    return the summary."""
    import pyarrow.parquet as pq
    import torch

    from genome_lm.eval.config import resolve_dtype
    from genome_lm.eval.run import checkpoint_record
    from genome_lm.model import build, token_lut
    from genome_lm.train.checkpoint import resolve_model_dir

    t0 = time.perf_counter()
    p = p.model_copy(update={"contexts": sorted(set(p.contexts))})
    inputs = [p.checkpoint, p.fasta, p.vcf, *([p.labels_tsv] if p.labels_tsv else [])]
    claim_output(p.out, "variants", inputs, p.overwrite)
    variants, counts, ref = _inputs(p)
    model_dir = resolve_model_dir(p.checkpoint)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build(model_dir, dtype=resolve_dtype(p.dtype, device), device=device).model.eval()
    lut = token_lut(VOCAB, model_dir)
    strands = ["+", "-"] if p.strands == "both" else ["+"]
    log.info("variants: %d variants x %d contexts x %d strands, %s", len(variants), len(p.contexts), len(strands),
             model_dir)
    rows: list[dict] = []
    t_score = time.perf_counter()
    with progress(len(variants) * len(p.contexts) * len(strands), desc=f"variants {Path(p.out).name}",
                  unit="variant", disable=show_progress is False) as bar:
        for L in p.contexts:
            for strand in strands:
                rows += _score(model, lut, ref, variants, L, strand, p, bar)
    scored = len(rows) / max(time.perf_counter() - t_score, 1e-9)  # variant x context x strand per second
    table = _table(rows, p.strands == "both")
    summary = {"command": "variants", "checkpoint": checkpoint_record(p.checkpoint),
               "reference": {"path": ref.path, "sha256": ref.sha256}, "contexts": p.contexts, "after": p.after,
               "strands": strands + (["both"] if p.strands == "both" else []), "variants": counts,
               "metrics": _metrics(table, p.contexts, p), "resamples": p.resamples, "seed": p.seed,
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
    m = s["metrics"]
    if m:
        def ci(lo_hi):
            return "[" + ", ".join("nan" if x is None else f"{x:.3f}" for x in lo_hi) + "]"

        def num(x):
            return "nan" if x is None else f"{x:.3f}"

        lines.append(f"strand {m['strand']}: {'context':>8} {'pos':>5} {'neg':>5}  AUROC [95% CI]        "
                     "AUPRC [95% CI]        dAUROC vs shortest")
        for b, d in zip(m["by_context"], m["paired_vs_shortest"]):
            lines.append(f"{'':9}{b['context']:>9} {b['n_pos']:>5} {b['n_neg']:>5}  {num(b['auroc'])} "
                         f"{ci(b['auroc_ci']):<15} {num(b['auprc'])} {ci(b['auprc_ci']):<15} "
                         f"{num(d['d_auroc'])} {ci(d['d_auroc_ci'])}")
    return "\n".join(lines)
