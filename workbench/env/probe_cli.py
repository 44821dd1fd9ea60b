"""`workbench probe`: the probe (workbench.env.probe) as a human table, or as JSON."""
from __future__ import annotations

import sys
from typing import Any

from workbench.env.probe import CAPABILITY_CHECKS, probe

SECTIONS = {  # the human table's groups, in order; keys not listed are not shown
    "system": ["python", "python_executable", "platform", "cpu_cores", "mem_total_gb", "mem_available_gb",
               "ngc_pytorch_container", "colab", "git_sha"],
    "torch": ["torch", "torch_cuda", "torch_cxx11_abi", "cudnn_torch", "cudnn_torch_error", "cudnn_mapped_dirs"],
    "GPU": ["gpu_name", "compute_capability", "gpu_count", "driver"],
    "toolkit": ["cuda_home", "nvcc_path", "nvcc_version", "nvcc_problem", "cudnn_system_header", "cudnn_pip_header",
                "cudnn_pip_packages"],
    "Transformer Engine": ["te_available", "te_version", "te_packages", "te_consistent", "te_import_error",
                           "te_attention"],
    "JAX (optional: the jax:* students)": ["jax_version", "jaxlib_version", "flax_version", "optax_version",
                                           "transformer_engine_jax_version"],
}


def rows(env: dict[str, Any]) -> list[dict[str, Any]]:
    """The probe as (section, item, value, note) rows, what `table` prints."""
    out = [
        {"section": s, "item": k, "value": env.get(k), "note": ""}
        for s, keys in SECTIONS.items()
        for k in keys
        if k in env
    ]
    for c in env.get("te_consistency") or []:
        out.append({"section": "TE consistency", "item": c["check"],
                    "value": {True: "ok", False: "FAIL", None: "n/a"}[c["ok"]], "note": c["detail"]})
    for key in CAPABILITY_CHECKS:
        if f"{key}_available" in env:
            out.append({"section": "TE capability", "item": key, "value": env[f"{key}_available"],
                        "note": env.get(f"{key}_reason") or ""})
    return out


def table(env: dict[str, Any]) -> str:
    lines, section = [], None
    for r in rows(env):
        if r["section"] != section:
            section = r["section"]
            lines.append(f"\n[{section}]")
        value = r["value"]
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items()) or "none"
        note = f"  ({r['note']})" if r["note"] else ""
        lines.append(f"  {r['item']:<22} {value}{note}")
    return "\n".join(lines).lstrip("\n")


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print JSON only")
    p.add_argument("--out", default=None, help="also write the JSON to this file (atomically)")


def main(args) -> int:
    import json

    env = probe(attention=True)
    if args.out:
        from workbench.results import write_json

        try:
            write_json(args.out, env)
        except OSError as e:
            print(f"workbench probe: --out {args.out}: cannot write it ({e.strerror or e}); give a file in a "
                  "writable folder", file=sys.stderr)
            return 2
    print(json.dumps(env, indent=2) if args.json else table(env))
    return 0
