#!/usr/bin/env python3
# Which cuBLASLt kernels the LM head's three products get (through PyTorch), and their times, for
# an odd vocabulary (GPT-2's 50257): as it is, with its rows padded apart, and padded to 50304.
# Runs on a GPU machine (scripts/gpu_check.sh head). docs/benchmarks.md, "The LM head padded".
import torch
from torch.profiler import profile, ProfilerActivity
n, C, V, Vp = 2048, 768, 50257, 50304
dev = 'cuda'; bf = torch.bfloat16
x = torch.randn(n, C, device=dev, dtype=bf)
Wp = torch.randn(Vp, C, device=dev, dtype=bf)
dyp = torch.randn(n, Vp, device=dev, dtype=bf)
Wodd = torch.randn(V, C, device=dev, dtype=bf)
dyodd = torch.randn(n, V, device=dev, dtype=bf)
def mm(a, b):
    try:
        return torch.mm(a, b, out_dtype=torch.float32)
    except Exception:
        return torch.mm(a, b)
cases = {
  'fwd ld odd   N=V ': lambda: mm(x, Wodd.t()),
  'fwd N=Vp        ': lambda: mm(x, Wp.t()),
  'dx  ld odd   K=V ': lambda: mm(dyodd, Wodd),
  'dx  ld Vp    K=V ': lambda: mm(dyp[:, :V], Wp[:V]),
  'dx  K=Vp        ': lambda: mm(dyp, Wp),
  'dW  ld odd   M=V ': lambda: mm(dyodd.t(), x),
  'dW  ld Vp    M=V ': lambda: mm(dyp[:, :V].t(), x),
  'dW  M=Vp        ': lambda: mm(dyp.t(), x),
}
print(torch.__version__, torch.cuda.get_device_name())
for name, f in cases.items():
    for _ in range(3): f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(10): f()
        torch.cuda.synchronize()
    ev = [e for e in p.key_averages() if e.device_type.name == 'CUDA' or 'CUDA' in str(e.device_type)]
    ev.sort(key=lambda e: -e.self_device_time_total if hasattr(e, 'self_device_time_total') else 0)
    e = ev[0]
    t = getattr(e, 'self_device_time_total', 0) / e.count
    print(f'{name} {t:8.1f} us  {e.key[:90]}')
