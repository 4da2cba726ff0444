#!/usr/bin/python3
"""The PyTorch side of tests/bench/bench-kernels.sh: the same GPT-style model
as kernels/model.h (pre-LN blocks, causal attention, tanh GELU, tied head),
the same batch and thread count, timed over whole training steps (zero_grad,
forward, backward, optimizer step).  Prints one key=value line like
bench_kernels.

    bench_kernels_torch.py [--model demo|sahaj] [--threads N] [--batch B]
                           [--steps N] [--optimizer adamw|lamb]

PyTorch 1.13 has no LAMB: it is written out per tensor as in
tests/gen_torch_reference.py (few tensors, so the Python loop costs little).
"""
import argparse
import math
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH, Fd):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, Fd)
        self.mlp_proj = nn.Linear(Fd, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        hd = C // self.NH
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.NH, hd).transpose(1, 2)
        k = k.view(B, T, self.NH, hd).transpose(1, 2)
        v = v.view(B, T, self.NH, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(mask[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, NH, C, T, V, Fd):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, NH, Fd) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        self.register_buffer("mask", ~torch.tril(torch.ones(T, T, dtype=torch.bool)))
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class Lamb:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, wd=0.01):
        self.params = list(params)
        self.lr, self.b1, self.b2, self.eps, self.wd = lr, betas[0], betas[1], eps, wd
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0

    @torch.no_grad()
    def step(self):
        self.t += 1
        bc1, bc2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
        for p, m, v in zip(self.params, self.m, self.v):
            g = p.grad
            m.mul_(self.b1).add_(g, alpha=1 - self.b1)
            v.mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
            u = (m / bc1) / ((v / bc2).sqrt_().add_(self.eps))
            r = 1.0
            if p.dim() >= 2:
                u.add_(p, alpha=self.wd)
                pn, un = p.norm().item(), u.norm().item()
                if pn > 0 and un > 0:
                    r = pn / un
            p.add_(u, alpha=-self.lr * r)


def cpu_seconds():
    """CPU seconds (user + system) of this process, as bench_kernels counts them."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo", choices=["demo", "sahaj"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--optimizer", default="adamw", choices=["adamw", "lamb"])
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    L, NH, C = (6, 8, 512) if a.model == "sahaj" else (4, 4, 256)
    T, V = 256, 256
    model = GPT(L, NH, C, T, V, 4 * C)
    n_params = sum(p.numel() for p in model.parameters())
    if a.optimizer == "lamb":
        opt = Lamb(model.parameters())
    else:
        decay = [p for p in model.parameters() if p.dim() >= 2]
        rest = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": rest, "weight_decay": 0.0}],
                                lr=3e-4, betas=(0.9, 0.95))
    data = torch.randint(0, V, (a.batch * T + 1,))
    idx, tg = data[:-1].view(a.batch, T), data[1:].view(a.batch, T)
    best = float("inf")
    for s in range(-2, a.steps):
        if s == 0:
            t0 = time.perf_counter()
            c0 = cpu_seconds()
        ts = time.perf_counter()
        for p in model.parameters():
            p.grad = None
        loss = model(idx, tg)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if s >= 0:
            best = min(best, time.perf_counter() - ts)
    dt = time.perf_counter() - t0
    cpu = cpu_seconds() - c0
    # FLOPs as kern_flops_per_sample: 3 x (L (2T(4C^2 + 2CF) + 2CT(T+1)) + 2TCV)
    Fd = 4 * C
    flops = 3 * (L * (2 * T * (4 * C * C + 2 * C * Fd) + 2 * C * T * (T + 1)) + 2 * T * C * V)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print("impl=torch-%s model=%s params=%d batch=%d seq=%d threads=%d optimizer=%s "
          "tokens_per_s=%.1f best_tokens_per_s=%.1f gflops=%.1f step_ms=%.1f cpu_ms=%.1f peak_rss_mb=%.1f "
          "loss=%.4f"
          % (torch.__version__, a.model, n_params, a.batch, T, a.threads, a.optimizer,
             a.batch * T * a.steps / dt, a.batch * T / best, flops * a.batch * a.steps / dt / 1e9,
             dt / a.steps * 1e3, cpu / a.steps * 1e3, rss, loss.item()))


if __name__ == "__main__":
    main()
