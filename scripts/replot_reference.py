"""Redraw the committed evidence's figures from their own result files with today's plotting code.

    python scripts/replot_reference.py [results/reference]    # rewrite in place, PNG only

Every run folder (students.csv + losses.csv) and bench folder (bench.csv) below the root gets the figures it
already has redrawn by workbench.results.plots; nothing new is added and no SVG is written (.gitignore keeps the
evidence PNG-only: results.write_figure's palette PNG is what is kept). A figure the plotting code no longer
draws for that folder (nothing to draw) is left as it is and named.
"""
from __future__ import annotations

import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's workbench, whatever is installed

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from workbench import results  # noqa: E402
from workbench.results import plots  # noqa: E402


def png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)  # as results.write_figure draws it
    return results.compact_png(buf.getvalue())


def study_curves(folder: Path):
    """A study's held-out curves from its curves.csv, the teacher's line from its headline.json."""
    import pandas as pd

    from workbench.study import figures, spec

    study = spec.Study.from_dict(results.read_json(folder / "study.json"))
    head = results.read_json(folder / "headline.json") if (folder / "headline.json").exists() else {}
    return figures.heldout_curves(study, pd.read_csv(folder / "curves.csv"), head.get("teacher_heldout_ppl"))


def replot(root: Path) -> list[Path]:
    written = []
    for folder in sorted({p.parent for p in root.rglob("*.png")}):
        if (folder / "students.csv").exists() and (folder / "losses.csv").exists():
            drawers = plots.run_plots(folder)
        elif (folder / "bench.csv").exists():
            drawers = plots.BENCH_PLOTS
        elif (folder / "study.json").exists() and (folder / "curves.csv").exists():
            drawers = {"heldout_curves": study_curves}
        else:
            continue  # a sweep report's figures: workbench.sweep.figures redraws those
        for old in sorted(folder.glob("*.png")):
            fn = drawers.get(old.stem)
            if fn is None:
                if old.stem in plots.PLOTS or old.stem in plots.BENCH_PLOTS:
                    print(f"kept (nothing to draw now): {old.relative_to(root)}")
                continue
            fig = fn(folder)
            results.write_bytes(old, png(fig))
            plt.close(fig)
            written.append(old)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]) if args else ROOT / "results" / "reference"
    for path in replot(root):
        print(f"redrew {path.relative_to(root)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
