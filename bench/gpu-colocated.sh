#!/usr/bin/env bash
# Colocated GPU refit (publishers and receivers on one GPU), issue 16: build,
# then the steps named in $STEPS (default: all), everything into $OUT.
#   tests:  the GPU tests (test_gpu, test_gpu_demo.sh); fp8tests: test_gpu_fp8
#   probe:  refit demo colocated, vllm:tp=1 and tp=2 (per-cycle JSON)
#   bench:  refit-bench --scenario colocated (tp=1 and tp=2, d2d copy baseline) -> gpu-h200-colocated.json
#   turns0: the same for tp=2 with cuda_ipc.turns=0 (receivers' kernels time-sliced)
#   kernel, memcpy: both layouts with cuda_ipc.copy=kernel / copy=memcpy forced
#   ipc:    bench/ipc_probe.cu: d2d copy from own memory, from a cudaIpc-opened and from a VMM-imported buffer
#   ncu:    Nsight Compute on one steady copy kernel of the tp=1 receiver (ncu-tp2: of a tp=2 receiver)
#   trace:  refit demo --prepare with REFIT_CUDA_TRACE (per-copy GPU times) for each of $TRACES (tpN-V, V:
#           beside / after / before: the small regions' kernel and the copies (REFIT_CUDA_SMALL); round0:
#           allocations not rounded to 2 MiB); GPU clocks sampled
#   replay: bench/ipc_probe.cu replays the traced tp=1 copies: own buffers, IPC-opened, after/while other
#           processes' kernels run, and one copy of as many bytes (needs trace first; REPLAY=tp1-round0 ...)
#   sizes:  bench/ipc_probe.cu: copy rate from IPC-opened buffers whose sizes are / are not multiples of 2 MiB
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH=/usr/local/cuda/bin:$PATH
model=${MODEL:-qwen3-30b-a3b}
steps=${STEPS:-tests bench kernel memcpy turns0}
out=${OUT:-bench/results/gpu-colocated-run}
mkdir -p "$out/run"
log=$out/run/log.txt
exec > >(tee "$log") 2>&1
{ date -u; nvidia-smi; nvcc --version | tail -2; } > "$out/run/env.txt" 2>&1
grep -E "Driver Version|H200|release" "$out/run/env.txt"
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DREFIT_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DREFIT_WITH_NCCL=OFF > "$out/run/cmake.txt" 2>&1 || { tail -30 "$out/run/cmake.txt"; exit 1; }
timeout 300 ninja -C build-gpu refit refit-bench test_gpu > "$out/run/ninja.txt" 2>&1; grep -E "FAILED|error" -A4 "$out/run/ninja.txt" | head -30; tail -2 "$out/run/ninja.txt"
echo "build: $(( $(date +%s) - t0 )) s"
[ -x build-gpu/refit ] || exit 1
R=build-gpu/refit
for s in $steps; do
  echo "== $s ($(date +%T))"
  case $s in
  tests)
    timeout 120 build-gpu/tests/test_gpu > "$out/run/test_gpu.txt" 2>&1; echo "test_gpu exit: $?"; tail -4 "$out/run/test_gpu.txt"
    timeout 200 tests/gpu/test_gpu_demo.sh build-gpu/refit > "$out/run/test_gpu_demo.txt" 2>&1; echo "test_gpu_demo exit: $?"
    tail -4 "$out/run/test_gpu_demo.txt" ;;
  fp8tests)  # the FP8 GPU tests too (their kept tensors go through the batch kernel)
    timeout 200 ninja -C build-gpu test_gpu_fp8 > "$out/run/ninja-fp8.txt" 2>&1 || tail -5 "$out/run/ninja-fp8.txt"
    timeout 200 build-gpu/tests/test_gpu_fp8 > "$out/run/test_gpu_fp8.txt" 2>&1; echo "test_gpu_fp8 exit: $?"
    tail -4 "$out/run/test_gpu_fp8.txt" ;;
  bench)
    timeout 400 $R-bench --scenario colocated --model "$model" --device 0 --cycles 6 --iters 5 \
      --out "$out/gpu-h200-colocated.json" > /dev/null; echo "bench exit: $?" ;;
  turns0)
    timeout 200 $R-bench --scenario colocated --model "$model" --dst vllm:tp=2 --no-cold --cycles 4 --iters 3 \
      --transport-options cuda_ipc.turns=0 --out "$out/run/colocated-tp2-turns0.json" > /dev/null; echo "turns0 exit: $?" ;;
  ipc)
    nvcc -O2 -arch=sm_90 -o build-gpu/ipc_probe bench/ipc_probe.cu -lcuda && \
      for gb in 8 24; do timeout 120 build-gpu/ipc_probe $gb | tee -a "$out/run/ipc-probe.txt"; done ;;
  kernel|memcpy)
    timeout 200 $R-bench --scenario colocated --model "$model" --no-cold --cycles 4 --iters 3 --dst ${DSTS:-vllm:tp=1} \
      --transport-options cuda_ipc.copy=$s --out "$out/run/colocated-$s.json" > /dev/null; echo "$s exit: $?" ;;
  probe)
    for tp in 1 2; do
      timeout 200 $R demo --json --model "$model" --src megatron:ep=2 --dst vllm:tp=$tp --transport cuda_ipc \
        --src-device 0 --dst-device 0 --cycles 4 > "$out/run/demo-tp$tp.json"
      python3 - "$out/run/demo-tp$tp.json" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
print(sys.argv[1], 'verified', d['verified'], 'steady span', d['steady_span_ms'], 'xfer', d['steady_transfer_ms'], 'bytes', d['bytes_per_cycle'])
for c in d['per_cycle']: print('  v%d span %.2f xfer %.2f connect %.2f discover %.2f plan %.2f launches %s' % (c['version'], c['span_ms'], c['transfer_ms'], c.get('connect_ms',0), c['discover_ms'], c['plan_ms'], c.get('launches')))
PY
    done ;;
  trace)
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu,temperature.gpu \
      --format=csv -lms 20 > "$out/run/clocks.txt" 2>&1 & smi=$!
    for c in ${TRACES:-tp1-beside tp1-after tp1-before tp2-beside}; do
      tp=${c%%-*}; tp=${tp#tp}; v=${c#*-}; rm -f "$out/run/trace-$c.txt"; round=
      [ $v = round0 ] && { v=beside; round=0; }
      REFIT_CUDA_ALLOC_ROUND=${round:-${REFIT_CUDA_ALLOC_ROUND:-}} REFIT_CUDA_SMALL=$v REFIT_CUDA_TRACE=$out/run/trace-$c.txt timeout 200 $R demo --json --prepare --model "$model" \
        --src megatron:ep=2 --dst vllm:tp=$tp --transport cuda_ipc --src-device 0 --dst-device 0 --cycles 5 \
        > "$out/run/trace-demo-$c.json" 2> "$out/run/trace-demo-$c.err"
      echo "$c exit $?: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('verified', d['verified'], 'steady transfer', d['steady_transfer_ms'], 'span', d['steady_span_ms'])" "$out/run/trace-demo-$c.json" 2>&1)"
      grep -E "^(pull|copies|kernel)" "$out/run/trace-$c.txt" | tail -6
    done
    kill $smi ;;
  replay)
    nvcc -O2 -arch=sm_90 -o build-gpu/ipc_probe bench/ipc_probe.cu -lcuda && \
      (cd "$out/run" && timeout 200 "$OLDPWD/build-gpu/ipc_probe" replay trace-${REPLAY:-tp1-beside}.txt 250) | \
      tee -a "$out/run/replay.txt" ;;
  sizes)
    nvcc -O2 -arch=sm_90 -o build-gpu/ipc_probe bench/ipc_probe.cu -lcuda && \
      timeout 200 build-gpu/ipc_probe sizes 8589934592 8589938688 8590000128 8592031744 25769803776 25769832448 \
        32073216000 32073842688 | tee "$out/run/ipc-sizes.txt" ;;
  ncu|ncu-tp2)
    tp=1; [ $s = ncu-tp2 ] && tp=2
    timeout 250 ncu --target-processes all --kernel-name regex:batch --launch-skip 1 --launch-count 1 --clock-control none \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
      --section WarpStateStats --section SchedulerStats -o "$out/run/prof" -f \
      $R demo --json --model "$model" --src megatron:ep=2 --dst vllm:tp=$tp --transport cuda_ipc \
        --src-device 0 --dst-device 0 --cycles 3 --timeout-s 300 > "$out/run/$s-demo.json" 2> "$out/run/$s-stderr.txt"
    echo "ncu exit $?"; tail -3 "$out/run/$s-stderr.txt"
    ncu -i "$out/run/prof.ncu-rep" --page details > "$out/run/$s.txt" 2>&1; rm -f "$out/run/prof.ncu-rep"
    grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Eligible Warps|No Eligible" "$out/run/$s.txt" | head -20 ;;
  esac
done
python3 - "$out"/gpu-h200-colocated.json $(ls "$out"/run/colocated-*.json 2>/dev/null) <<'PY'
import json, sys
for p in sys.argv[1:]:
    try: d = json.load(open(p))
    except Exception as e: print(p, e); continue
    print(p, 'limit_ratio', d['limit_ratio'], 'first_refit_ratio', d['first_refit_ratio'], 'verified', d['verified'])
    for r in d['runs']:
        print('  %s refit %.2f ms xfer %.2f ms d2d %.2f ms kernel-alone %.2f ms limit %.3f first %.2f ms (%.2fx) prepare %.1f ms cold first %.1f ms open %.1f ms verified %s' % (
            r['dst'], r['refit_s']*1e3, r['refit_transfer_s']*1e3, r['d2d_copy_s']*1e3, r['bench_copy_kernel_s']*1e3, r['limit_ratio'],
            r['first_refit_s']*1e3, r['first_refit_ratio'], r['prepare_s']*1e3, r['cold_first_refit_s']*1e3, r['cold_handle_open_ms'], r['verified']))
        print('     lanes:', r['refit']['lanes'] if r.get('refit') else None)
PY
sleep 1; tar czf "$out/run.tgz" -C "$out" run && rm -rf "$out/run"
echo "total: $(( $(date +%s) - t0 )) s"
