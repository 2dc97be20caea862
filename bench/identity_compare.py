"""How :mod:`bench.export_identity` compares two runs' output directories, file by file.

A safetensors file is compared tensor by tensor (the raw bytes of each entry; where they
differ, the maximum absolute difference, so a numeric change is told from a layout change) and
its JSON metadata field by field; a JSON or JSONL file field by field; anything else byte for
byte. Fields that legitimately differ between two runs are excluded only by the explicit rules
of :data:`EXCLUDED`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DONE = ".export_identity.json"  # written into a run's directory when it completed

# (file pattern, field pattern, why it may differ). In a pattern "*" matches any run of
# characters and everything else only itself; a field is its dotted path in the JSON document
# ("[i]" for the i-th element of a list or of a JSONL file; "metadata.<key>." before the JSON
# held in a safetensors metadata entry).
EXCLUDED: list[tuple[str, str, str]] = [
    ("report.json", "wall_seconds", "wall time of the whole run"),
    ("report.json", "stages[*].wall_seconds", "wall time of a stage"),
    ("report.json", "stages[*].seconds", "wall time of a stage"),
    ("report.json", "checkpoint.path", "path of the run's output directory"),
    (
        "report.json",
        "checkpoint.bytes",
        "size of the training checkpoint: its metadata holds wall times (excluded there), "
        "so it varies from run to run of one revision",
    ),
    ("report.json", "export.path", "path of the run's output directory"),
    ("report.json", "*time*", "a duration or a clock reading"),
    ("report.json", "hf_export.*.path", "path of the run's output directory"),
    ("report.json", "hf_export.deploy.*.latency_ms", "measured inference latency"),
    ("report.json", "hf_export.deploy.*.tokens_per_second", "measured inference throughput"),
    ("report.json", "hf_export.deploy.ratios.speedup_*", "ratio of measured latencies"),
    ("report.json", "hf_export.deploy.*.peak_bytes", "measured peak memory of an inference"),
    ("report.json", "hf_export.deploy.ratios.memory_*", "ratio of measured peak memories"),
    ("metrics.jsonl", "[*].*time*", "a duration or a clock reading"),
    ("metrics.jsonl", "[*].*seconds*", "a duration"),
    ("metrics.jsonl", "[*].*per_s*", "a throughput (a duration)"),
    ("metrics.jsonl", "[*].seconds", "wall time of a stage"),
    ("metrics.jsonl", "[*].path", "path of the run's output directory"),
    ("ranks.jsonl", "[*].*time*", "a duration or a clock reading"),
    ("checkpoints/*.safetensors", "metadata.comera.*seconds*", "a duration"),
    ("checkpoints/*.safetensors", "metadata.comera.*time*", "a duration or a clock reading"),
]


# -- comparison -------------------------------------------------------------------------------
@functools.cache
def _pattern(text: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in text.split("*")), re.DOTALL)


def matches(text: str, pattern: str) -> bool:
    """``pattern`` covers all of ``text``; "*" is the only wildcard."""
    return _pattern(pattern).fullmatch(text) is not None


def excluded_rule(rel: str, path: str) -> tuple[str, str, str] | None:
    """The rule of :data:`EXCLUDED` that covers field ``path`` of file ``rel``, if any."""
    for file_pat, field_pat, why in EXCLUDED:
        if matches(rel, file_pat) and matches(path, field_pat):
            return file_pat, field_pat, why
    return None


def _short(value: Any, limit: int = 120) -> Any:
    text = json.dumps(value, sort_keys=True, default=str)
    return value if len(text) <= limit else text[:limit] + "..."


def json_diff(a: Any, b: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """Every leaf where ``a`` and ``b`` differ: (dotted path, value in a, value in b)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in a:
                yield sub, "<absent>", _short(b[key])
            elif key not in b:
                yield sub, _short(a[key]), "<absent>"
            else:
                yield from json_diff(a[key], b[key], sub)
    elif isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            sub = f"{path}[{i}]"
            if i >= len(a):
                yield sub, "<absent>", _short(b[i])
            elif i >= len(b):
                yield sub, _short(a[i]), "<absent>"
            else:
                yield from json_diff(a[i], b[i], sub)
    elif type(a) is not type(b) or a != b:
        if not (isinstance(a, float) and isinstance(b, float) and a != a and b != b):  # NaN
            yield path, _short(a), _short(b)


def split_fields(
    rel: str, diffs: Iterator[tuple[str, Any, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The differing fields, split into (not excluded, excluded by a rule)."""
    kept, excluded = [], []
    for path, va, vb in diffs:
        rule = excluded_rule(rel, path)
        entry = {"field": path, "before": va, "after": vb}
        if rule is None:
            kept.append(entry)
        else:
            excluded.append({**entry, "rule": f"{rule[0]}: {rule[1]}"})
    return kept, excluded


def excluded_fields_present(rel: str, doc: Any, path: str = "") -> Iterator[str]:
    """Paths of ``doc`` (leaves or subtrees) that a rule excludes, equal or not."""
    if path and excluded_rule(rel, path) is not None:
        yield path
        return
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from excluded_fields_present(rel, value, f"{path}.{key}" if path else str(key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from excluded_fields_present(rel, value, f"{path}[{i}]")


def read_json_doc(path: Path) -> Any:
    """A JSON file, or a JSONL file as a list of its lines' documents."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def safetensors_parts(path: Path) -> tuple[dict[str, Any], dict[str, Any], bytes]:
    """(tensor entries: name -> {dtype, shape, data_offsets}, metadata, data bytes)."""
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    metadata = header.pop("__metadata__", None) or {}
    return header, metadata, blob[8 + n :]


def _metadata_doc(metadata: dict[str, Any]) -> dict[str, Any]:
    """Metadata values that hold JSON, parsed (so their fields can be compared and excluded)."""
    out: dict[str, Any] = {}
    for key, value in metadata.items():
        try:
            out[key] = json.loads(value) if isinstance(value, str) else value
        except json.JSONDecodeError:
            out[key] = value
    return out


def _max_abs_diff(entry_a: dict, data_a: bytes, entry_b: dict, data_b: bytes) -> float | None:
    import torch
    from safetensors.torch import load

    def tensor(entry: dict, data: bytes) -> torch.Tensor:
        lo, hi = entry["data_offsets"]
        header = json.dumps({"t": {**entry, "data_offsets": [0, hi - lo]}}).encode()
        return load(struct.pack("<Q", len(header)) + header + data[lo:hi])["t"]

    a, b = tensor(entry_a, data_a), tensor(entry_b, data_b)
    if a.shape != b.shape:
        return None
    if a.numel() == 0:
        return 0.0
    diff = (a.double() - b.double()).abs()
    return float(diff.nan_to_num(nan=float("inf")).max())


def compare_safetensors(rel: str, a: Path, b: Path) -> dict[str, Any]:
    """Tensor by tensor (raw bytes; max abs diff where they differ) and the metadata."""
    ha, ma, da = safetensors_parts(a)
    hb, mb, db = safetensors_parts(b)
    tensors: dict[str, Any] = {}
    for name in sorted(set(ha) | set(hb)):
        if name not in ha or name not in hb:
            tensors[name] = {"status": "only_after" if name not in ha else "only_before"}
            continue
        ea, eb = ha[name], hb[name]
        if ea["dtype"] != eb["dtype"] or ea["shape"] != eb["shape"]:
            tensors[name] = {
                "status": "dtype_or_shape",
                "before": [ea["dtype"], ea["shape"]],
                "after": [eb["dtype"], eb["shape"]],
            }
            continue
        sa = da[ea["data_offsets"][0] : ea["data_offsets"][1]]
        sb = db[eb["data_offsets"][0] : eb["data_offsets"][1]]
        if sa != sb:
            tensors[name] = {
                "status": "values",
                "max_abs_diff": _max_abs_diff(ea, da, eb, db),
                "dtype": ea["dtype"],
                "shape": ea["shape"],
            }
    kept, excluded = split_fields(rel, json_diff(_metadata_doc(ma), _metadata_doc(mb), "metadata"))
    order_same = list(ha) == list(hb) and [ha[k]["data_offsets"] for k in ha] == [
        hb[k]["data_offsets"] for k in hb
    ]
    out: dict[str, Any] = {
        "tensors_compared": len(set(ha) & set(hb)),
        "tensors_differing": tensors,
        "metadata_differing": kept,
        "excluded_differing": excluded,
    }
    if not tensors and not kept:
        out["status"] = "same_tensors_excluded_metadata" if excluded else "layout"
        out["layout_note"] = (
            "every tensor bitwise equal; "
            + ("header order or offsets differ" if not order_same else "header bytes differ")
            if not excluded
            else "every tensor bitwise equal; only excluded metadata fields differ"
        )
    else:
        out["status"] = "differs"
    return out


def compare_file(rel: str, a: Path, b: Path) -> dict[str, Any]:
    """One file present on both sides."""
    ba, bb = a.read_bytes(), b.read_bytes()
    if ba == bb:
        return {"status": "identical", "bytes": len(ba)}
    out: dict[str, Any] = {
        "bytes": [len(ba), len(bb)],
        "sha256": [hashlib.sha256(ba).hexdigest(), hashlib.sha256(bb).hexdigest()],
    }
    if rel.endswith(".safetensors"):
        return {**out, **compare_safetensors(rel, a, b)}
    if rel.endswith((".json", ".jsonl")):
        try:
            kept, excluded = split_fields(rel, json_diff(read_json_doc(a), read_json_doc(b)))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            return {**out, "status": "differs", "note": f"not JSON: {err}"}
        out["fields_differing"] = kept[:50]
        out["fields_differing_count"] = len(kept)
        out["excluded_differing"] = excluded
        if kept:
            out["status"] = "differs"
        else:
            out["status"] = "excluded_fields_only" if excluded else "json_layout"
        return out
    return {**out, "status": "differs"}


def is_export(rel: str) -> bool:
    """Files of the export proper (the rest are the run's records and training checkpoints)."""
    return rel.startswith("model/") or rel == "tokenizer.json"


# statuses that mean "no behaviour change" for a file
EQUIVALENT = {"identical", "excluded_fields_only", "same_tensors_excluded_metadata"}


def compare_dirs(a: Path, b: Path, ignore: tuple[str, ...] = (DONE,)) -> dict[str, Any]:
    """Every file under ``a`` and ``b`` (relative paths), compared; the verdict and the list of
    excluded fields present in the compared JSON documents."""
    files_a = {p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file()}
    files: dict[str, Any] = {}
    excluded_present: dict[str, list[str]] = {}
    for rel in sorted(files_a | files_b):
        if rel in ignore or any(part.startswith(".") for part in rel.split("/")):
            continue
        if rel not in files_a or rel not in files_b:
            files[rel] = {"status": "only_after" if rel not in files_a else "only_before"}
            continue
        files[rel] = compare_file(rel, a / rel, b / rel)
        if rel.endswith((".json", ".jsonl")):
            try:
                present = sorted(set(excluded_fields_present(rel, read_json_doc(a / rel))))
            except (json.JSONDecodeError, UnicodeDecodeError):
                present = []
            if present:
                excluded_present[rel] = present
        elif rel.endswith(".safetensors"):
            present = sorted(
                set(
                    excluded_fields_present(
                        rel, _metadata_doc(safetensors_parts(a / rel)[1]), "metadata"
                    )
                )
            )
            if present:
                excluded_present[rel] = present
    export = {k: v for k, v in files.items() if is_export(k)}
    records = {k: v for k, v in files.items() if not is_export(k)}

    def verdict(group: dict[str, Any]) -> str:
        if not group:
            return "no_files"
        if all(v["status"] == "identical" for v in group.values()):
            return "identical"
        if all(v["status"] in EQUIVALENT for v in group.values()):
            return "identical_except_excluded_fields"
        return "differs"

    return {
        "export": verdict(export),
        "records": verdict(records),
        "differing_files": sorted(k for k, v in files.items() if v["status"] not in EQUIVALENT),
        "files": files,
        "excluded_fields_present": excluded_present,
    }
