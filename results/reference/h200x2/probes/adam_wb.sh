# The workbench's own TE FusedAdam paths at seed: eager, whole-step graph, graph + bf16 moments.
run() { id=$1; shift
  timeout 120 python3 -m workbench run --preset seed --out /tmp/aw --run-id $id --set backends=torch_bf16,te_fp8:current \
    --set baseline=torch_bf16 --set steps=8 --set warmup=2 --set iters=5 --set eval_batches=1 --set param_dtype=bf16 "$@" > /tmp/aw-$id.log 2>&1
  python3 -c "
import pandas as pd; d=pd.read_csv('/tmp/aw/$id/losses.csv'); s=pd.read_csv('/tmp/aw/$id/students.csv')
print('$id', s[['student','status','optimizer','graph_scope','initial_loss']].to_dict('records'))
print(d.pivot(index='step', columns='student', values='loss').round(4).T.to_string())" 2>&1 | tail -6
}
run adamw-graph --set graphs=true --set te_graph=step --set fused_optimizer=true
run te-eager --set optimizer=te_fused_adam
run te-graph --set optimizer=te_fused_adam --set graphs=true --set te_graph=step
run te-graph-fused --set optimizer=te_fused_adam --set graphs=true --set te_graph=step --set layout=fused
run te-eager-fused --set optimizer=te_fused_adam --set layout=fused
