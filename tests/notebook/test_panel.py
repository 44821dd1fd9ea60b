"""The main notebook's widget panel (workbench.panel), through its widget objects (no browser): labels that
show, the reason a backend cannot run here where the user looks, typed values that are refused out loud
rather than coerced, a default that can run here, rows that wrap, and the Run button's runs."""
import ipywidgets as w
import pytest

from workbench import backends, config, panel, results

# what availability() answers on a CPU box without TE or torchao, fixed so the tests read the same on a GPU
CPU = {
    "te_fp8:delayed": "transformer_engine.pytorch does not import: ModuleNotFoundError: No module named "
                      "'transformer_engine'",
    "te_fp8:mxfp8": "transformer_engine.pytorch does not import: ModuleNotFoundError: No module named "
                    "'transformer_engine'",
    "torch_fp16": "fp16 autocast with a grad scaler is a GPU path; on CPU use torch_bf16 or torch_fp32",
}


@pytest.fixture
def p(tmp_path, monkeypatch):
    """A cpu-smoke panel whose runs are recorded, not made (run_cell returns a folder name)."""
    monkeypatch.setattr(panel, "availability", lambda preset: dict(CPU))
    made: list[dict] = []

    def run_cell(ns):
        made.append(ns)
        return tmp_path / ns["run_id"]

    monkeypatch.setattr(panel.notebook, "run_cell", run_cell)
    monkeypatch.setattr(panel.notebook, "timings_note", lambda d: "")
    monkeypatch.setattr(panel.Panel, "figures", staticmethod(lambda dirs: []))
    pan = panel.Panel(preset="cpu-smoke", out=tmp_path)
    pan.made = made
    return pan


def test_panel_is_skipped_under_papermill_and_when_turned_off():
    papermill_ns = {"In": ["", "# Parameters\npreset = \"cpu-smoke\"\n"], "show_panel": None}
    assert panel.under_papermill(papermill_ns) and panel.maybe_show(papermill_ns) is None
    assert panel.maybe_show({"In": [""], "show_panel": False}) is None
    assert not panel.under_papermill({"In": ["", "preset = 'seed'"]})


def test_every_input_shows_its_label(p):
    """ipywidgets' tags inputs (IntsInput) render no `description`: the sizes box had no visible label."""
    inputs = p.widget.children[0].children
    assert [i.description for i in inputs] == ["preset", "hidden", "MLP ×", "GPUs"]
    assert not any(isinstance(i, w.widgets.widget_tagsinput.TagsInputBase) for i in inputs)


def test_a_backend_that_cannot_run_here_says_why_in_its_label(p):
    """ipywidgets 8.1 shows a labelled checkbox's label on hover, never its tooltip: the reason is in the label
    (its first clause; the whole reason in the 'why' list), and no tooltip pretends otherwise."""
    for spec, box in p.backends.items():
        if spec in CPU:
            assert panel.CANNOT in box.description and CPU[spec].split(":")[0].split(";")[0] in box.description
            assert CPU[spec] in p.widget.children[3].value  # the 'why' list, whole
        else:
            assert box.description == spec
        assert not box.tooltip, spec
    shown = list(p.backends)  # what can run here first: the long labels below it
    assert shown == [s for s in shown if s not in CPU] + [s for s in shown if s in CPU]
    assert "fp16 autocast with a grad scaler is a GPU path" in p.backends["torch_fp16"].description
    assert "on CPU use" not in p.backends["torch_fp16"].description  # shortened: the first clause


@pytest.mark.parametrize(("box", "label", "allowed"), [
    ("sizes", "hidden", "whole numbers of 1 or more"), ("ratio", "MLP ×", "from 1 to 64"),
    ("nproc", "GPUs", "one whole number of 1 or more")])
@pytest.mark.parametrize("typed", ["1O24", "0", "1.5", "", "100"])
def test_a_value_not_allowed_is_named_kept_and_nothing_runs(p, box, label, allowed, typed):
    """'1O24' (letter O) became a size-1 tag, or 64 in 'MLP ×', with no word: now the panel names the box,
    what was typed and what is allowed, keeps the text in its box, and runs nothing until it is fixed."""
    if typed == "100" and box != "ratio":
        typed = "1O0"  # 100 is a fine size and GPU count; 'MLP ×' stops at 64
    getattr(p, box).value = typed
    assert f"Not run: {label}:" in p.message.value and allowed in p.message.value  # said on leaving the box
    assert (repr(typed) if typed else "empty") in p.message.value.replace("&#x27;", "'")
    p.run_button.click()
    assert p.made == [] and p.last_runs == [] and getattr(p, box).value == typed
    assert f"Not run: {label}:" in p.message.value
    getattr(p, box).value = "2"
    assert p.message.value == ""
    p.run_button.click()
    assert len(p.made) == 1 and not p.run_button.disabled


def test_sizes_are_typed_as_text_several_at_once(p):
    p.sizes.value, p.ratio.value, p.nproc.value = "64, 96 64", "3", "2"
    assert [(ns["hidden"], ns["intermediate"], ns["nproc"]) for ns in p.namespaces()] == [(64, 192, 2), (96, 288, 2)]
    p.run_button.click()
    assert [ns["run_id"] for ns in p.made] == ["hidden64", "hidden96"] and p.message.value == ""


def test_the_default_ticks_only_what_can_run_here(p):
    """On a CPU, cpu-smoke's te_fp8:delayed cannot run: it is not ticked, yet stays selectable (its row is then
    a fallback with its reason)."""
    base = config.from_preset("cpu-smoke")
    assert "te_fp8:delayed" in base.backends
    assert p.chosen() == [s for s in backends.all_specs() if s in base.backends and s not in CPU]
    p.backends["te_fp8:delayed"].value = True
    assert "te_fp8:delayed" in p.namespaces()[0]["backends"]


def test_inputs_are_plain_widgets_and_the_rows_wrap(p):
    """Issue 33 (ecosystem 9): a checkbox list (no ctrl-click), and rows that wrap (GPUs on screen at 1280 px)."""
    assert all(isinstance(b, w.Checkbox) for b in p.backends.values())
    rows = [c for c in p.widget.children if isinstance(c, w.Box) and not isinstance(c, w.VBox)]
    assert len(rows) == 2 and all(r.layout.flex_flow == "row wrap" for r in rows)
    assert p.nproc in rows[0].children


def test_availability_marks_what_cannot_run_on_this_machine():
    from workbench.run import runner

    base = config.from_preset("cpu-smoke")
    ctx = backends.Context(device=runner.resolve_device(base), cfg=base)
    cannot = panel.availability("cpu-smoke")
    for spec in backends.all_specs():
        ok, why = backends.make(spec).availability(ctx)
        assert cannot.get(spec) == (None if ok else why), spec
    if runner.resolve_device(base).type == "cpu":
        assert "te_fp8:mxfp8" in cannot and "torch_fp32" not in cannot


@pytest.mark.slow
def test_panel_run_button_runs_each_size_with_the_notebook_call(tmp_path):
    p = panel.Panel(preset="cpu-smoke", out=tmp_path)
    assert "te_fp8:current" in p.backends and p.ratio.value == "4"
    p.nproc.value = "2"  # a multi-GPU run goes through run_cell, as the notebook's: its config asks for 2 processes
    assert {ns["nproc"] for ns in p.namespaces()} == {2}
    p.nproc.value = "1"
    p.sizes.value = "32, 48"
    for spec, box in p.backends.items():
        box.value = spec in ("torch_fp32", "torch_bf16")
    p.run_button.click()
    assert [d.name for d in p.last_runs] == ["hidden32", "hidden48"] and not p.run_button.disabled
    df = results.load(p.last_runs[0].parent)
    assert sorted(df["cfg_intermediate"].unique()) == [128, 192] and set(df["student"]) == {"torch_fp32", "torch_bf16"}
    p.sizes.value = "0"  # invalid: said in the panel, nothing run
    p.run_button.click()
    assert p.last_runs and len(list(tmp_path.iterdir())) == 1 and "Not run: hidden" in p.message.value
