"""Transformer Engine FP8 (and FP4) students: the recipe picks the scaling scheme.

FP8 GEMMs run inside bf16 torch autocast, so everything TE does not quantise (LayerNorm, GELU,
residuals) runs in bf16 exactly as in the bf16 students: the FP8-vs-bf16 comparison isolates the GEMMs.
Each recipe is gated by TE's own capability check, and its reason is the row's reason.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import os
import sys

import torch
from packaging.version import Version
from torch.distributed.tensor import distribute_tensor

from workbench.backends import MASTER_INIT, Context, Student, check_matched, reference_state, register, to_param_dtype
from workbench.backends._gemm import misaligned, not_multiples
from workbench.backends._te import Conversion, TEBackend, TERun, head_fp8, te_usable, to_te
from workbench.env import te as te_env

# recipe name -> (TE capability check, required dim multiple)
RECIPES = {  # the first is the default
    "delayed": ("is_fp8_available", 16),  # DelayedScaling, HYBRID: E4M3 forward, E5M2 gradients
    "delayed_e4m3": ("is_fp8_available", 16),  # the tutorial's: DelayedScaling(margin=0, E4M3)
    "current": ("is_fp8_available", 16),  # Float8CurrentScaling
    "block": ("is_fp8_block_scaling_available", 16),  # Float8BlockScaling
    "mxfp8": ("is_mxfp8_available", 32),  # MXFP8BlockScaling (Blackwell)
    "nvfp4": ("is_nvfp4_available", 128),  # NVFP4BlockScaling (Blackwell); autocast does not check it
}

# TE's FSDP2 recipe for FP8 weights (quantized_model_init on the meta device, shard, then initialise; FusedAdam
# with fp32 master weights): from TE 2.16 FusedAdam keeps those masters as DTensors sharded like the parameters.
FSDP2_MIN_TE = Version("2.16")
# NVFP4 weights made by quantized_model_init are not sharded by TE under FSDP2 (TE's own FSDP2 tests mark
# it unsupported, 2.16 to 2.20: run_fsdp2_fused_adam.py); every other recipe has TE's all-gather hooks.
FSDP2_RECIPES = tuple(r for r in RECIPES if r != "nvfp4")


def te_version() -> Version | None:
    """The imported Transformer Engine's version (None when it does not say)."""
    v = getattr(sys.modules.get("transformer_engine"), "__version__", None)
    return Version(v) if v else None


def fsdp2_refusal(recipe: str, version: Version | None) -> str:
    """Why TE's FSDP2 recipe for FP8 weights cannot run `recipe` with this TE ('' when it can)."""
    if version is None or version < FSDP2_MIN_TE:
        return (f"options.te_fp8_weights=true under parallel.strategy='fsdp2' runs TE's FSDP2 recipe for FP8 weights, "
                f"which needs Transformer Engine >= {FSDP2_MIN_TE} (sharded fp32 master weights in its FusedAdam); "
                f"this TE is {version or 'of unknown version'}: upgrade it, or set parallel.strategy='ddp' or "
                "options.te_fp8_weights=false")
    if recipe not in FSDP2_RECIPES:
        return (f"recipe {recipe} cannot keep FP8 weights under parallel.strategy='fsdp2' (TE does not shard "
                f"quantized_model_init's {recipe} weights with FSDP2); recipes allowed with "
                f"options.te_fp8_weights=true there: {', '.join(FSDP2_RECIPES)}")
    return ""


def shards_fp8_weights(cfg) -> bool:
    """Whether this run spreads FP8-weight students with FSDP2 (TE's recipe, `TEFP8.sharded`). Inside
    torchrun its WORLD_SIZE decides, as for `distributed.Spread`: `torchrun -m workbench run` leaves nproc at 1."""
    p = cfg.parallel
    ranks = int(os.environ.get("WORLD_SIZE", 0)) or p.nproc * p.nnodes
    return cfg.options.te_fp8_weights and p.strategy == "fsdp2" and ranks > 1


def inference_refusal(ctx: Context, recipe: str, dims: dict[str, int], whose: str = "the") -> str:
    """'' when TE can run `recipe` here for FP8 GEMMs of these dims (by name), else why, in TE's own words
    where TE gives them: what a forward-only TE FP8 model (an FP8 teacher) must pass before it is converted."""
    ok, why = te_usable(ctx)
    if not ok:
        return why
    te, _, _ = te_env.load()
    check, multiple = RECIPES[recipe]
    ok, why = te_env.check(getattr(te, check, None), f"fp8 ({check})")
    if not ok:
        return why
    bad = not_multiples(dims, multiple)
    return f"{whose} FP8 GEMMs need dims that are multiples of {multiple}; not: {', '.join(bad)}" if bad else ""


FP8_DPA_RECIPES = ("delayed", "delayed_e4m3", "current")  # TE's fp8_dpa: delayed and current scaling


def make_recipe(recipe_mod, name: str, amax_history_len: int = 16, amax_compute_algo: str = "max",
                reduce_amax: bool = True, fp8_dpa: bool = False):
    """TE's recipe object for a recipe name; 'delayed' takes its amax history settings from the config's
    BackendOptions, 'delayed_e4m3' is exactly the tutorial's (TE's defaults). `reduce_amax=False`: delayed
    scaling keeps its amaxes to this process (TE otherwise all-reduces them over the default group whenever
    torch.distributed is initialised, even for a student that runs on one rank alone)."""
    R = recipe_mod
    dpa = {"fp8_dpa": True} if fp8_dpa else {}  # FP8 attention (options.te_fp8_dpa): FP8_DPA_RECIPES only
    if name == "delayed":
        return R.DelayedScaling(margin=0, fp8_format=R.Format.HYBRID, amax_history_len=amax_history_len,
                                amax_compute_algo=amax_compute_algo, reduce_amax=reduce_amax, **dpa)
    if name == "delayed_e4m3":
        return R.DelayedScaling(margin=0, fp8_format=R.Format.E4M3, reduce_amax=reduce_amax, **dpa)
    if name == "current":
        return R.Float8CurrentScaling(**dpa)
    return {
        "block": R.Float8BlockScaling,
        "mxfp8": R.MXFP8BlockScaling,
        "nvfp4": R.NVFP4BlockScaling,
    }[name]()


@register
class TEFP8(TEBackend):
    name = "te_fp8"
    recipes = tuple(RECIPES)
    mode = "TE-FP8"
    quantized_weights = True

    @property
    def gemm_precision(self) -> str:
        return "fp4" if self.recipe == "nvfp4" else "fp8"

    def availability(self, ctx: Context) -> tuple[bool, str]:
        ok, why = te_usable(ctx)
        if not ok:
            return ok, why
        te, _, _ = te_env.load()
        check, multiple = RECIPES[self.recipe]
        ok, why = te_env.check(getattr(te, check, None), f"{self.recipe} ({check})")
        if not ok:
            return False, why
        if ctx.cfg.options.te_fp8_dpa and self.recipe not in FP8_DPA_RECIPES:
            return False, (f"options.te_fp8_dpa: TE runs FP8 attention with {', '.join(FP8_DPA_RECIPES)} scaling, "
                           f"not recipe {self.recipe}")
        bad = misaligned(ctx.cfg, multiple)
        if bad:
            return False, (f"recipe {self.recipe} needs GEMM dims that are multiples of {multiple}; "
                           f"not: {', '.join(bad)}")
        why = fsdp2_refusal(self.recipe, te_version()) if shards_fp8_weights(ctx.cfg) else ""
        return not why, why

    def run(self, cfg, device, group=None) -> TERun:
        """How its forward runs: TE's recipe from the config's options; `group` the data-parallel group its amaxes
        are reduced over. A student not spread over the ranks (a distributed run's one-GPU reference, timed on
        rank 0 while the others wait) must not all-reduce: on the H200 pair that collective waited forever for
        the idle ranks."""
        _, recipe_mod, _ = te_env.load()
        o = cfg.options
        alone = group is None and torch.distributed.is_available() and torch.distributed.is_initialized()
        dpa = o.te_fp8_dpa and self.recipe in FP8_DPA_RECIPES
        recipe = make_recipe(recipe_mod, self.recipe, o.te_amax_history_len, o.te_amax_compute_algo,
                             reduce_amax=not alone, fp8_dpa=dpa)
        return TERun(device, torch.bfloat16, o.te_attention, recipe=recipe, group=group, fp8_dpa=dpa)

    def prepare(self, reference, cfg, device, ranks=None) -> Student:
        run = self.run(cfg, device, ranks.group if ranks else None)
        if ranks is not None and ranks.shard is not None and cfg.options.te_fp8_weights:
            return self.sharded(reference, cfg, run, ranks.shard)
        model = copy.deepcopy(reference)
        report = self.quantized(model, cfg, run) if cfg.options.te_fp8_weights else to_te(
            model, cfg, device, head_fp8=head_fp8(cfg, self.gemm_precision))
        check_matched(model, reference)
        run = dataclasses.replace(run, te_attention=report.te_attention)
        student = self.student(model.to(device), cfg, run, report)
        if cfg.options.te_fp8_weights:
            student = dataclasses.replace(student, describe=functools.partial(_with_init_note, student.describe))
        return student

    def convert(self, model, cfg):
        """With options.te_fp8_weights the TE layers are built under te.quantized_model_init (`quantized`)."""
        if not cfg.options.te_fp8_weights:
            return super().convert(model, cfg)
        self.quantized(model, cfg, self.run(cfg, next(model.parameters()).device))
        return model

    def quantized(self, model, cfg, run: TERun) -> Conversion:
        """`model` converted in place with its TE layers built under te.quantized_model_init: their weights are FP8
        tensors (the shared init, quantized), and each keeps that init in fp32 for its master copy in the
        optimizer (`loop.te_fused_adam`), so training starts from exactly the shared weights."""
        te, _, _ = te_env.load()
        exact = {k: v.detach().float().cpu() for k, v in reference_state(to_param_dtype(model, cfg)).items()}
        with te.quantized_model_init(enabled=True, recipe=run.recipe):
            report = to_te(model, cfg, run.device, head_fp8=head_fp8(cfg, self.gemm_precision), fp8_weights=True)
        exact = model.from_reference_state(exact)  # under the converted names (a TE layer's fused QKV, gate/up)
        for name, p in model.named_parameters():
            if isinstance(p, te.QuantizedTensor):
                setattr(p, MASTER_INIT, exact[name])
        return report

    def sharded(self, reference, cfg, run: TERun, shard) -> Student:
        """The student with FP8 weights spread by FSDP2 as TE's recipe says (TE >= 2.16; its example
        examples/pytorch/quantized_model_init/fully_shard.py): the GEMM layers made on the meta device under
        te.quantized_model_init, `shard` (FSDP2's fully_shard per block, then the root) applied, then each
        rank's shards materialised on its GPU by the layers' own reset_parameters. That fills them with TE's
        random init; each shard is then given its part of the shared init instead (a copy into an FP8 tensor
        quantizes with the layer's own quantizer) and keeps that part in fp32 for its master weight in the
        optimizer (`loop.te_fused_adam`), so every rank trains from exactly the shared weights."""
        te, _, _ = te_env.load()
        model = to_param_dtype(copy.deepcopy(reference), cfg)
        # kept on the host: each goes to the GPU only while it is split into this rank's shard
        exact = {k: v.detach().float().cpu() for k, v in reference_state(model).items()}
        with te.quantized_model_init(enabled=True, recipe=run.recipe):
            report = to_te(model, cfg, run.device, meta=True, head_fp8=head_fp8(cfg, self.gemm_precision),
                           fp8_weights=True)
        check_matched(model, reference)
        exact = model.from_reference_state(exact)  # under the converted names (a TE layer's fused QKV, gate/up)
        later = {name for name, p in model.named_parameters() if p.is_meta}
        shard(model)  # FSDP2 moves the torch layers' shards to the device; the meta ones stay meta
        for m in model.modules():
            if any(p.is_meta for p in m.parameters(recurse=False)):
                m.reset_parameters()
        with torch.no_grad():
            for name, p in model.named_parameters():  # the parameters reset_parameters made
                if name in later:
                    part = distribute_tensor(exact[name], p.device_mesh, p.placements, src_data_rank=None).to_local()
                    p._local_tensor.copy_(part)  # the DTensor's own shard (TE's FusedAdam reaches it the same way)
                    setattr(p, MASTER_INIT, part)
        run = dataclasses.replace(run, te_attention=report.te_attention)
        student = self.student(model, cfg, run, report, sharded=True)
        return dataclasses.replace(student, describe=functools.partial(_with_init_note, student.describe))


def _with_init_note(describe) -> dict:
    return {**describe(), "init_note": ("initial_loss is the loss of the FP8-rounded weights; the fp32 master "
                                        "weights the optimizer trains start at the shared init")}
