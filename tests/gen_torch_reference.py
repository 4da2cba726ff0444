#!/usr/bin/python3
"""Write tests/data/torch_reference.bin (two tiny cotrain models) or, with
--tiled, tests/data/torch_reference_tiled.bin (one model whose attention and
products take the kernels' multi-block and tiled paths): what PyTorch
computes, for tests/test_kernels_torch.c to match.

Run with a python3 that has torch (Debian's python3-torch):
    /usr/bin/python3 tests/gen_torch_reference.py tests/data/torch_reference.bin
    /usr/bin/python3 tests/gen_torch_reference.py --tiled tests/data/torch_reference_tiled.bin
Each file is written from its own seed, so either can be regenerated alone
(a different torch version may change the last bits of its values).

The model is written out here op by op, in cotrain's parameter layout
(kernels/model.h: GPT-2 names, linear weights [in, out], block l uses
parameter set l * n_shared // n_layer), so the reference is PyTorch's own
arithmetic (F.layer_norm, F.gelu(approximate='tanh'), softmax, cross_entropy,
autograd) on the same weights and batch.

Case "a" (L=2, S=2): weights, batch, logits, loss, every gradient, and the
parameters after 3 AdamW steps (torch.optim.AdamW) and after 3 LAMB steps
(the apex rule, written out below), each step fed the case's gradient,
clipped by torch.nn.utils.clip_grad_norm_, with the learning-rate schedule
of kernels/optimizer.h (warmup and decay both active).  Case "b" (L=2, S=1,
ALBERT sharing): weights, batch, logits, loss, gradients.

Case "c" (--tiled; L=2, S=1, T=96, B=3, C=32, F=128, V=128): weights, batch,
logits, loss, gradients.  T is above the attention's row block
(KERN_ATT_BLOCK, 64 in kernels/attention.h), so the forward and backward run
over a full and a partial block; the MLP and head products are B*T x 128 x 32
= 1.18e6 multiply-adds, above the 1e6 where kernels/backend_cpu.c hands a
product to its GEMM driver or cuts it into OpenBLAS tiles (3 row tiles of
128 here).  About 310 KB.

File format (little-endian): magic b"CTREF001", uint32 record count, then per
record: uint32 name length, name, uint32 dtype (0 float32, 1 int32), uint32
ndim, uint32 shape[ndim], the data.
"""
import math
import struct
import sys

import torch
import torch.nn.functional as F

torch.set_num_threads(1)

SET_NAMES = [
    ("ln_1.weight", lambda C, Fd: (C,)), ("ln_1.bias", lambda C, Fd: (C,)),
    ("attn.c_attn.weight", lambda C, Fd: (C, 3 * C)), ("attn.c_attn.bias", lambda C, Fd: (3 * C,)),
    ("attn.c_proj.weight", lambda C, Fd: (C, C)), ("attn.c_proj.bias", lambda C, Fd: (C,)),
    ("ln_2.weight", lambda C, Fd: (C,)), ("ln_2.bias", lambda C, Fd: (C,)),
    ("mlp.c_fc.weight", lambda C, Fd: (C, Fd)), ("mlp.c_fc.bias", lambda C, Fd: (Fd,)),
    ("mlp.c_proj.weight", lambda C, Fd: (Fd, C)), ("mlp.c_proj.bias", lambda C, Fd: (C,)),
]


def views(cfg):
    L, S, NH, C, T, V, Fd = cfg
    out = [("wte", (V, C)), ("wpe", (T, C))]
    for s in range(S):
        out += [("h.%d.%s" % (s, n), shp(C, Fd)) for n, shp in SET_NAMES]
    out += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    return out


def init_params(cfg):
    L = cfg[0]
    params = {}
    for name, shape in views(cfg):
        if len(shape) == 1:
            # LayerNorm weights near 1, biases near 0, but not exactly, so
            # that every gradient path is exercised
            base = 1.0 if name.endswith(".weight") else 0.0
            t = base + 0.1 * torch.randn(shape)
        else:
            std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02
            t = std * torch.randn(shape)
        params[name] = t.float().requires_grad_(True)
    return params


def forward(cfg, P, tokens, targets):
    L, S, NH, C, T, V, Fd = cfg
    B = tokens.shape[0]
    hd = C // NH
    x = P["wte"][tokens] + P["wpe"][:T].unsqueeze(0)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        s = l * S // L
        p = lambda n: P["h.%d.%s" % (s, n)]
        h = F.layer_norm(x, (C,), p("ln_1.weight"), p("ln_1.bias"), eps=1e-5)
        qkv = h @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, hd).transpose(1, 2)
        k = k.view(B, T, NH, hd).transpose(1, 2)
        v = v.view(B, T, NH, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + (y @ p("attn.c_proj.weight") + p("attn.c_proj.bias"))
        h = F.layer_norm(x, (C,), p("ln_2.weight"), p("ln_2.bias"), eps=1e-5)
        h = F.gelu(h @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias"), approximate="tanh")
        x = x + (h @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias"))
    x = F.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], eps=1e-5)
    logits = x @ P["wte"].t()
    loss = F.cross_entropy(logits.view(-1, V), targets.view(-1))
    return logits, loss


def lr_at(o, s):
    """kernels/optimizer.h kern_opt_lr."""
    lr, warmup, total, decay, mn = o["lr"], o["warmup"], o["total"], o["decay"], o["min_ratio"]
    if s < warmup:
        return lr * (s + 1) / warmup
    if decay == 0 or total <= warmup:
        return lr
    q = min(1.0, (s - warmup) / (total - warmup))
    if decay == 1:
        return lr * (1 - q * (1 - mn))
    return lr * (mn + (1 - mn) * (1 + math.cos(math.pi * q)) / 2)


def decays(shape):
    return len(shape) >= 2


def run_adamw(cfg, params, grads, o, steps):
    names = [n for n, _ in views(cfg)]
    P = {n: params[n].detach().clone().requires_grad_(True) for n in names}
    dec = [P[n] for n in names if decays(P[n].shape)]
    nodec = [P[n] for n in names if not decays(P[n].shape)]
    opt = torch.optim.AdamW([{"params": dec, "weight_decay": o["wd"]},
                             {"params": nodec, "weight_decay": 0.0}],
                            lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"],
                            foreach=False)
    for s in range(steps):
        for n in names:
            P[n].grad = grads[n].clone()
        torch.nn.utils.clip_grad_norm_([P[n] for n in names], o["clip"])
        for g in opt.param_groups:
            g["lr"] = lr_at(o, s)
        opt.step()
    return {n: P[n].detach() for n in names}


def run_lamb(cfg, params, grads, o, steps):
    """LAMB as NVIDIA apex's FusedLAMB (use_nvlamb off: no trust ratio where
    weight decay is 0), bias correction on."""
    names = [n for n, _ in views(cfg)]
    P = {n: params[n].detach().clone() for n in names}
    m = {n: torch.zeros_like(P[n]) for n in names}
    v = {n: torch.zeros_like(P[n]) for n in names}
    b1, b2, eps = o["beta1"], o["beta2"], o["eps"]
    for s in range(steps):
        g = {n: grads[n].clone().requires_grad_(False) for n in names}
        holders = [torch.nn.Parameter(P[n].clone()) for n in names]
        for h, n in zip(holders, names):
            h.grad = g[n]
        torch.nn.utils.clip_grad_norm_(holders, o["clip"])
        lr = lr_at(o, s)
        t = s + 1
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        for h, n in zip(holders, names):
            gr = h.grad
            wd = o["wd"] if decays(P[n].shape) else 0.0
            m[n] = m[n] * b1 + (1 - b1) * gr
            v[n] = v[n] * b2 + (1 - b2) * gr * gr
            u = (m[n] / bc1) / ((v[n] / bc2).sqrt() + eps) + wd * P[n]
            r = 1.0
            if wd != 0:
                pn, un = P[n].norm().item(), u.norm().item()
                if pn > 0 and un > 0:
                    r = pn / un
            P[n] = P[n] - (lr * r) * u
    return P


class Writer:
    def __init__(self):
        self.records = []

    def f32(self, name, t):
        t = torch.as_tensor(t, dtype=torch.float32).detach().contiguous()
        self.records.append((name, 0, list(t.shape), t.numpy().astype("<f4").tobytes()))

    def i32(self, name, t):
        t = torch.as_tensor(t, dtype=torch.int32).contiguous()
        self.records.append((name, 1, list(t.shape), t.numpy().astype("<i4").tobytes()))

    def save(self, path):
        with open(path, "wb") as f:
            f.write(b"CTREF001")
            f.write(struct.pack("<I", len(self.records)))
            for name, dt, shape, data in self.records:
                nb = name.encode()
                f.write(struct.pack("<I", len(nb)) + nb)
                f.write(struct.pack("<II", dt, len(shape)))
                f.write(struct.pack("<%dI" % len(shape), *shape))
                f.write(data)


def opt_record(o):
    return [o["lr"], o["beta1"], o["beta2"], o["eps"], o["wd"], o["clip"],
            o["warmup"], o["total"], o["decay"], o["min_ratio"]]


def case(w, tag, cfg, B, with_opt):
    L, S, NH, C, T, V, Fd = cfg
    params = init_params(cfg)
    tokens = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    logits, loss = forward(cfg, params, tokens, targets)
    loss.backward()
    w.i32(tag + ".config", list(cfg))
    w.i32(tag + ".tokens", tokens)
    w.i32(tag + ".targets", targets)
    w.f32(tag + ".logits", logits)
    w.f32(tag + ".loss", [loss.item()])
    for n, _ in views(cfg):
        w.f32(tag + ".param." + n, params[n])
    grads = {n: params[n].grad.detach().clone() for n, _ in views(cfg)}
    for n, _ in views(cfg):
        w.f32(tag + ".grad." + n, grads[n])
    total = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))
    print("%s: loss %.6f, gradient norm %.4f" % (tag, loss.item(), total))
    if not with_opt:
        return
    # clip below the gradient norm so that clipping acts; decay kinds:
    # 0 none, 1 linear, 2 cosine (kern_decay_kind)
    adamw = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, wd=0.1, clip=0.5 * total,
                 warmup=1, total=3, decay=1, min_ratio=0.1)
    lamb = dict(lr=2e-2, beta1=0.9, beta2=0.999, eps=1e-6, wd=0.01, clip=0.5 * total,
                warmup=3, total=10, decay=2, min_ratio=0.1)
    w.f32(tag + ".opt.adamw", opt_record(adamw))
    w.f32(tag + ".opt.lamb", opt_record(lamb))
    pa = run_adamw(cfg, params, grads, adamw, 3)
    pl = run_lamb(cfg, params, grads, lamb, 3)
    for n, _ in views(cfg):
        w.f32(tag + ".adamw." + n, pa[n])
    for n, _ in views(cfg):
        w.f32(tag + ".lamb." + n, pl[n])


def main():
    args = sys.argv[1:]
    tiled = bool(args) and args[0] == "--tiled"
    if tiled:
        args = args[1:]
    w = Writer()
    # config: n_layer, n_shared, n_head, d_model, seq_len, vocab, d_ff
    if tiled:
        path = args[0] if args else "tests/data/torch_reference_tiled.bin"
        torch.manual_seed(5678)
        case(w, "c", (2, 1, 2, 32, 96, 128, 128), 3, False)
    else:
        path = args[0] if args else "tests/data/torch_reference.bin"
        torch.manual_seed(1234)
        case(w, "a", (2, 2, 2, 32, 16, 256, 128), 2, True)
        case(w, "b", (2, 1, 2, 32, 16, 256, 128), 2, False)
    w.save(path)
    print("wrote", path)


if __name__ == "__main__":
    main()
