"""Transformer Engine FP8 (and FP4) students: the recipe picks the scaling scheme.

FP8 GEMMs run inside bf16 torch autocast, so everything TE does not quantise (LayerNorm, GELU,
residuals) runs in bf16 exactly as in the bf16 students: the FP8-vs-bf16 comparison isolates the GEMMs.
Each recipe is gated by TE's own capability check, and its reason is the row's reason.
"""
from __future__ import annotations

import contextlib
import copy
import os
import sys

import torch
from packaging.version import Version
from torch.distributed.tensor import distribute_tensor

from workbench.backends import MASTER_INIT, Context, autocast, check_matched, reference_state, register, to_param_dtype
from workbench.backends._gemm import misaligned
from workbench.backends._te import TEBackend, te_usable
from workbench.env import te as te_env

# recipe name -> (TE capability check, required dim multiple)
RECIPES = {
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
    """Whether this run spreads FP8-weight students with FSDP2 (TE's recipe, `TEFP8.build_sharded`). Inside
    torchrun its WORLD_SIZE decides, as for `distributed.Spread`: `torchrun -m workbench run` leaves nproc at 1."""
    p = cfg.parallel
    ranks = int(os.environ.get("WORLD_SIZE", 0)) or p.nproc * p.nnodes
    return cfg.options.te_fp8_weights and p.strategy == "fsdp2" and ranks > 1


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
    default_recipe = "delayed"
    mode = "TE-FP8"
    fp8 = True
    quantized_weights = True
    fp8_weights = False  # set by build: this student keeps FP8 weights (options.te_fp8_weights)
    amax_reduction_group = None  # a distributed run's data-parallel group (set by workbench.run.parallel)

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

    def _use_recipe(self, cfg) -> None:
        _, recipe_mod, _ = te_env.load()
        o = cfg.options
        # A student not spread over the ranks (a distributed run's one-GPU reference, timed on rank 0 while the
        # others wait) must not all-reduce: on the H200 pair that collective waited forever for the idle ranks.
        alone = (self.amax_reduction_group is None and torch.distributed.is_available()
                 and torch.distributed.is_initialized())
        self.fp8_recipe = make_recipe(recipe_mod, self.recipe, o.te_amax_history_len, o.te_amax_compute_algo,
                                      reduce_amax=not alone, fp8_dpa=o.te_fp8_dpa and self.recipe in FP8_DPA_RECIPES)
        self.fp8_dpa = o.te_fp8_dpa and self.recipe in FP8_DPA_RECIPES
        self.fp8_weights = o.te_fp8_weights

    def build(self, reference, cfg, device):
        self._use_recipe(cfg)
        model = super().build(reference, cfg, device)
        self.dtype = torch.bfloat16
        return model

    def build_sharded(self, reference, cfg, device, shard):
        """The student with FP8 weights spread by FSDP2 as TE's recipe says (TE >= 2.16; its example
        examples/pytorch/quantized_model_init/fully_shard.py): the GEMM layers made on the meta device under
        te.quantized_model_init, `shard` (FSDP2's fully_shard per block, then the root) applied, then each
        rank's shards materialised on its GPU by the layers' own reset_parameters. That fills them with TE's
        random init; each shard is then given its part of the shared init instead (a copy into an FP8 tensor
        quantizes with the layer's own quantizer) and keeps that part in fp32 for its master weight in the
        optimizer (`loop.te_fused_adam`), so every rank trains from exactly the shared weights."""
        te, _, _ = te_env.load()
        self.claim()
        self._use_recipe(cfg)
        self.device, self.dtype, self.fp8_weights = device, torch.bfloat16, True
        model = to_param_dtype(copy.deepcopy(reference), cfg)
        # kept on the host: each goes to the GPU only while it is split into this rank's shard
        exact = {k: v.detach().float().cpu() for k, v in reference_state(model).items()}
        with te.quantized_model_init(enabled=True, recipe=self.fp8_recipe):
            TEBackend.convert(self, model, cfg, meta=True)
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
        return model

    def convert(self, model, cfg):
        """With options.te_fp8_weights the TE layers are built under te.quantized_model_init: their weights
        are FP8 tensors (the shared init, quantized), and each keeps that init in fp32 for its master copy
        in the optimizer (`loop.te_fused_adam`), so training starts from exactly the shared weights."""
        if not self.fp8_weights:
            return super().convert(model, cfg)
        te, _, _ = te_env.load()
        exact = {k: v.detach().float().cpu() for k, v in reference_state(to_param_dtype(model, cfg)).items()}
        with te.quantized_model_init(enabled=True, recipe=self.fp8_recipe):
            model = super().convert(model, cfg)
        exact = model.from_reference_state(exact)  # under the converted names (a TE layer's fused QKV, gate/up)
        for name, p in model.named_parameters():
            if isinstance(p, te.QuantizedTensor):
                setattr(p, MASTER_INIT, exact[name])
        return model

    def can_graph(self, cfg, device):
        if cfg.options.te_fp8_weights:
            # TE's FusedAdam refuses capturable=True with FP8 weights, and an eager update of FP8 weights
            # between replays of a forward/backward graph is a path TE does not document
            return False, "FP8 weights (options.te_fp8_weights) are updated by TE's FusedAdam outside any graph"
        return super().can_graph(cfg, device)

    def describe(self, model):
        out = super().describe(model)
        if self.fp8_weights:
            out["init_note"] = ("initial_loss is the loss of the FP8-rounded weights; the fp32 master weights the "
                                "optimizer trains start at the shared init")
        return out

    def forward_context(self):
        stack = super().forward_context()
        if getattr(self, "fp8_dpa", False) and self.runs_te_attention:
            stack.enter_context(fp8_attention_refusal())
        return stack

    def autocasts(self) -> list:
        te, _, _ = te_env.load()
        # exactly the bf16 students' autocast, then TE's FP8 one
        return [autocast(self.device, torch.bfloat16), te_env.autocast(te, self.fp8_recipe, self.amax_reduction_group)]

    def outside_training(self, model):
        delayed = getattr(self.fp8_recipe, "delayed", None)
        return kept_fp8_scaling(model) if callable(delayed) and delayed() else contextlib.nullcontext()


@contextlib.contextmanager
def fp8_attention_refusal():
    """TE's "no attention backend" under options.te_fp8_dpa, said in the option's words: FP8 attention runs in
    cuDNN's fused attention only, which refuses some shapes (on the H200 with TE 2.20 / cuDNN 9.19: head
    size 64), and TE's unfused attention does not do FP8."""
    try:
        yield
    except ValueError as e:
        if "No dot product attention backend" not in str(e):
            raise
        raise RuntimeError(
            "options.te_fp8_dpa=true: TE has no FP8 attention backend for this student's attention here (FP8 "
            "attention runs in cuDNN's fused attention only; NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2 prints TE's reasons, "
            f"`workbench probe` writes them to te_attention.log); set options.te_fp8_dpa=false (TE: {e})") from e


@contextlib.contextmanager
def kept_fp8_scaling(model):
    """Delayed scaling's state as it is on entry, put back on exit: every TE module's scale and amax
    history. Forwards that are not training steps (held-out evaluation, graph-capture warm-ups) record
    their amaxes there and would move the scales the next training steps quantise with.

    Through TE's own get_fp8_meta_tensors / reset_fp8_meta_tensors (what te.make_graphed_callables does
    around its warm-ups), which copy into the same tensors: a captured CUDA graph still reads them. Not
    get_extra_state / set_extra_state: that pickles (TE 2.20 refuses to load a delayed-scaling pickle
    without NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1), synchronizes the device and also overwrites the
    modules' bookkeeping in fp8_meta. A module not yet initialised for FP8 on entry returns to TE's
    initial state (scale 1, empty history), which is what its first training step would have found."""
    modules = [m for m in model.modules()
               if hasattr(m, "get_fp8_meta_tensors") and hasattr(m, "reset_fp8_meta_tensors")]
    saved = [m.get_fp8_meta_tensors() for m in modules]
    try:
        yield
    finally:
        for m, state in zip(modules, saved):
            m.reset_fp8_meta_tensors(state)
