#!/usr/bin/python3
"""The PyTorch side of tests/bench/bench-encoder.sh: the same ALBERT as
kernels/encoder.h (factorised embedding, one shared block, post-LN, tanh
GELU, the MLM head on the masked positions only, tied decoder, SOP head),
written as Hugging Face's AlbertForPreTraining computes it, the same batch
and thread count, timed over whole training steps (masking, zero_grad,
forward, backward, AdamW step).  Prints one key=value line like
bench_encoder.

    bench_encoder_torch.py [--model demo|sahaj] [--threads N] [--batch B] [--steps N]
"""
import argparse
import math
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = {
    "demo": dict(E=128, H=256, L=4, NH=4, F=1024, T=128, V=8000),
    "sahaj": dict(E=128, H=1024, L=24, NH=16, F=4096, T=512, V=32000),
}
EPS = 1e-12


class Layer(nn.Module):
    def __init__(self, H, NH, Fd):
        super().__init__()
        self.NH = NH
        self.qkv = nn.Linear(H, 3 * H)
        self.dense = nn.Linear(H, H)
        self.ln1 = nn.LayerNorm(H, eps=EPS)
        self.ffn = nn.Linear(H, Fd)
        self.ffn_out = nn.Linear(Fd, H)
        self.ln2 = nn.LayerNorm(H, eps=EPS)

    def forward(self, x):
        B, T, H = x.shape
        hd = H // self.NH
        q, k, v = self.qkv(x).split(H, dim=2)
        q = q.view(B, T, self.NH, hd).transpose(1, 2)
        k = k.view(B, T, self.NH, hd).transpose(1, 2)
        v = v.view(B, T, self.NH, hd).transpose(1, 2)
        att = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(hd), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, H)
        x = self.ln1(x + self.dense(y))
        return self.ln2(x + self.ffn_out(F.gelu(self.ffn(x), approximate="tanh")))


class Albert(nn.Module):
    def __init__(self, E, H, L, NH, F, T, V):
        super().__init__()
        self.L = L
        self.word = nn.Embedding(V, E)
        self.pos = nn.Embedding(T, E)
        self.seg_emb = nn.Embedding(2, E)
        self.emb_ln = nn.LayerNorm(E, eps=EPS)
        self.proj = nn.Linear(E, H)
        self.layer = Layer(H, NH, F)
        self.pooler = nn.Linear(H, H)
        self.sop = nn.Linear(H, 2)
        self.mlm_dense = nn.Linear(H, E)
        self.mlm_ln = nn.LayerNorm(E, eps=EPS)
        self.mlm_bias = nn.Parameter(torch.zeros(V))
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids, seg, labels, sop):
        T = ids.shape[1]
        x = self.emb_ln(self.word(ids) + self.seg_emb(seg) + self.pos.weight[:T])
        x = self.proj(x)
        for _ in range(self.L):
            x = self.layer(x)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        sop_loss = F.cross_entropy(self.sop(pooled), sop)
        flat = labels.reshape(-1)
        rows = (flat != -100).nonzero().squeeze(1)
        h = x.reshape(-1, x.shape[-1])[rows]
        h = self.mlm_ln(F.gelu(self.mlm_dense(h), approximate="tanh"))
        logits = h @ self.word.weight.t() + self.mlm_bias
        return F.cross_entropy(logits, flat[rows]) + sop_loss


def mask_batch(g, B, c):
    """[CLS] A [SEP] B [SEP], 15% of the ordinary tokens predicted (80/10/10)."""
    T, V = c["T"], c["V"]
    ids = torch.randint(5, V, (B, T), generator=g)
    ids[:, 0] = 2
    ids[:, T // 2] = 3
    ids[:, T - 1] = 3
    seg = torch.zeros(B, T, dtype=torch.long)
    seg[:, T // 2 + 1:] = 1
    labels = torch.full((B, T), -100, dtype=torch.long)
    n = round(0.15 * (T - 3))
    cand = torch.tensor([t for t in range(1, T - 1) if t != T // 2])
    for b in range(B):
        pos = cand[torch.randperm(len(cand), generator=g)[:n]]
        labels[b, pos] = ids[b, pos]
        u = torch.rand(n, generator=g)
        ids[b, pos[u < 0.8]] = 4
        rnd = pos[(u >= 0.8) & (u < 0.9)]
        ids[b, rnd] = torch.randint(5, V, (len(rnd),), generator=g)
    sop = torch.randint(0, 2, (B,), generator=g)
    return ids, seg, labels, sop


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo", choices=sorted(MODELS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    c = MODELS[a.model]
    model = Albert(**c)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    g = torch.Generator().manual_seed(3)
    total, best, cpu0 = 0.0, 1e300, 0.0
    for s in range(a.steps + 1):
        if s == 1:
            cpu0 = cpu_seconds()
        t0 = time.perf_counter()
        ids, seg, labels, sop = mask_batch(g, a.batch, c)
        opt.zero_grad(set_to_none=True)
        loss = model(ids, seg, labels, sop)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if s == 0:
            continue
        total += dt
        best = min(best, dt)
    cpu = cpu_seconds() - cpu0
    tok = a.batch * c["T"]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    nparams = sum(p.numel() for p in model.parameters())
    print("impl=torch model=%s threads=%d batch=%d steps=%d tokens_per_s=%.1f best_tokens_per_s=%.1f "
          "step_ms=%.1f cpu_ms=%.1f peak_rss_mb=%.0f params=%d torch=%s"
          % (a.model, a.threads, a.batch, a.steps, tok * a.steps / total, tok / best, 1000 * total / a.steps,
             1000 * cpu / a.steps, rss, nparams, torch.__version__))


if __name__ == "__main__":
    main()
