# Why train/optim.rs does not use the fused AdamW kernel: run `.venv/bin/python scripts/fused_adamw_check.py`.
# Compares libtorch's fused AdamW kernel (torch._fused_adamw_, CPU) with the op sequence of
# engine/src/train/optim.rs::AdamW::apply, on fp32 masters, over 200 steps with weight decay,
# a varying lr (warmup + cosine) and clipping (the grads are pre-scaled by the same factor
# for both, as optim.rs does before the update).
import math, torch
torch.manual_seed(0)
torch.set_num_threads(1)
b1, b2, eps, wd = 0.9, 0.999, 1e-8, 0.01
shapes = [(256, 512), (512,), (1024, 64), (7,)]
def init():
    return [torch.randn(s) * 0.02 for s in shapes]
p_ref = init(); p_fus = [p.clone() for p in p_ref]
m_ref = [torch.zeros_like(p) for p in p_ref]; v_ref = [torch.zeros_like(p) for p in p_ref]
m_fus = [torch.zeros_like(p) for p in p_ref]; v_fus = [torch.zeros_like(p) for p in p_ref]
steps = [torch.zeros((), dtype=torch.float32) for _ in p_ref]
def lr_at(t, total=200, warm=20, peak=6e-4):
    if t < warm: return peak * (t + 1) / warm
    return peak * 0.5 * (1 + math.cos(math.pi * (t - warm) / (total - warm)))
first_diff = None
for t in range(200):
    raw = [torch.randn(s) * (10 ** torch.empty(1).uniform_(-3, 1).item()) for s in shapes]
    norm = torch.stack([g.norm() for g in raw]).norm().item()
    clip = min(1.0 / (norm + 1e-6), 1.0)
    grads = [g * clip if clip != 1.0 else g.clone() for g in raw]
    lr = lr_at(t)
    step = t + 1
    bc1 = 1 - b1 ** step; bc2s = math.sqrt(1 - b2 ** step); ss = lr / bc1
    for p, m, v, g in zip(p_ref, m_ref, v_ref, grads):   # optim.rs, op for op
        p.mul_(1 - lr * wd)
        m.lerp_(g, 1 - b1)
        v.mul_(b2); v.addcmul_(g, g * (1 - b2))
        d = v.sqrt(); d.div_(bc2s); d.add_(eps); d.div_(-ss)
        p.addcdiv_(m, d)
    for s_ in steps: s_.add_(1)
    torch._fused_adamw_(p_fus, grads, m_fus, v_fus, [], steps, lr=lr, beta1=b1, beta2=b2,
                        weight_decay=wd, eps=eps, amsgrad=False, maximize=False)
    same = all(torch.equal(a, b) for a, b in zip(p_ref, p_fus))
    if not same and first_diff is None: first_diff = step
def rel(a, b): return max(((x - y).abs().max() / y.abs().max()).item() for x, y in zip(a, b))
def ulps(a, b):
    return max((x.view(torch.int32).long() - y.view(torch.int32).long()).abs().max().item() for x, y in zip(a, b))
print(f"torch {torch.__version__}; first step with a bitwise difference: {first_diff}")
print(f"after 200 steps: params max rel diff {rel(p_fus, p_ref):.3e} (max {ulps(p_fus, p_ref)} ulp), "
      f"exp_avg {rel(m_fus, m_ref):.3e}, exp_avg_sq {rel(v_fus, v_ref):.3e}")
print("bitwise equal params:", all(torch.equal(a, b) for a, b in zip(p_ref, p_fus)))
print("bitwise equal exp_avg:", all(torch.equal(a, b) for a, b in zip(m_ref, m_fus)))
print("bitwise equal exp_avg_sq:", all(torch.equal(a, b) for a, b in zip(v_ref, v_fus)))
