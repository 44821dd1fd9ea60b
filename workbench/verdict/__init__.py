"""`workbench verdict MODEL`: the answer for one model in one command. Does FP8 pay at this model's shape, by how
much against the fastest bf16 path, and why (or why not)?

    python -m workbench verdict llama-3.2-1b --preset hf-llama-1b --out results/verdict/llama-3.2-1b
    python -m workbench verdict models/my-model --preset hf-llama-4l --set model.batch=8 --out DIR

predict.py (+ shapes.py): the prediction from config.json alone, on any machine: each GEMM's FP8 eligibility,
the FLOPs split, ideal step times at the peaks, memory-bound floors, a speed-up range per recipe, assumptions.
measured.py: the GPU part (the bench against the fastest bf16 row). quality.py: what FP8 does to what the student
learns, from studies that ran (`--study DIR`). page.py: verdict.json, verdict.md, verdict.png.
"""
