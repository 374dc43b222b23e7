#!/bin/bash
# N ranks with comm.deterministic against one rank accumulating their N micro-batches: the loss
# bits of every step, for every stage and placement of the Fashion-MNIST configs (figures for
# docs/PERFORMANCE.md). Usage: T=path/to/zinfinity-train tests/tools/ranks-equivalence.sh [STEPS]
# (runs mpirun; as root it sets Open MPI's two variables).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T=$(realpath "${T:-build/tools/zinfinity-train}")
C=$(cd "$(dirname "$0")/../../configs" && pwd)
STEPS=${1:-200}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT; cd "$work"
for cfg in "fashion-mnist.json:0" "fashion-mnist.json:1" "fashion-mnist.json:2" "fashion-mnist.json:3" "fashion-mnist-cpu.json:2" "fashion-mnist-cpu.json:3" "fashion-mnist-nvme.json:3"; do
  f=${cfg%%:*}; st=${cfg##*:}
  for n in 2 4; do
    mb=$((128 / n))
    $T --config $C/$f --set zero_optimization.stage=$st --set train_micro_batch_size_per_gpu=$mb --set gradient_accumulation_steps=$n --max-steps $STEPS --no-eval --loss-log ref$n.txt > ref$n.out 2>&1 || { echo "ref $f $st failed"; tail -3 ref$n.out; }
    mpirun --oversubscribe -np $n $T --config $C/$f --set zero_optimization.stage=$st --set train_micro_batch_size_per_gpu=$mb --set comm.deterministic=true --max-steps $STEPS --no-eval --loss-log det$n.txt > det$n.out 2>&1 || { echo "ws$n $f $st failed"; tail -5 det$n.out; }
    python3 - "$f" "$st" "$n" <<'PY'
import sys, struct
n=int(sys.argv[3])
f32=lambda x: struct.unpack('f', struct.pack('f', x))[0]
ref=[struct.unpack('>f', bytes.fromhex(l.split()[2]))[0] for l in open('ref%d.txt'%n)]
got=[l.split()[2] for l in open('det%d.txt'%n)]
want=[]
for s in range(len(ref)//n):
    acc=float(ref[s*n])
    for r in range(1,n): acc+=float(ref[s*n+r])
    want.append(struct.pack('>f', f32(acc/n)).hex())
same=sum(1 for a,b in zip(got,want) if a==b)
print(f"{sys.argv[1]} stage {sys.argv[2]} ws {n} deterministic vs 1 rank x {n} accumulated: {same}/{len(want)} steps bitwise equal ({len(got)} logged)")
PY
  done
done
