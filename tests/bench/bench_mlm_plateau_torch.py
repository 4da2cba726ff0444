#!/usr/bin/python3
"""A PyTorch screen for tests/bench/bench_mlm_plateau (doc/model.md "The
ALBERT demo"): the demo's ALBERT shape (factorised embedding, one post-LN
block shared by every layer, tied MLM decoder, SOP head; torch's own
TransformerEncoderLayer, so independent of kernels/), trained in stream
order on the ids that `bench_mlm_plateau --dump-ids FILE` writes, with the
same 15% masking (80% [MASK], 10% random, 10% kept) and SOP pairs, to try an
initialisation or a diagnostic in a minute before building it in C.

    bench_mlm_plateau_torch.py ids=FILE spec=MASK,CLS,SEP,PAD,UNK [key=value ...]

spec: the special ids that --dump-ids prints.  Keys (defaults in brackets):
V [2000] T [32] H [128] E [128] L [2] F [512] B [8] steps [3000] every [500]
opt adamw|lamb [adamw] lr [1e-3] eps [1e-6] (AdamW's) warm [200] sopw [1] (SOP loss
weight);
initial values: pos normal|sin [normal] posstd [0.02], wordstd, ubias=1 (MLM
output bias = the training ids' log frequencies), mim=S (query and key
weights one shared random matrix times S, "mimetic"), loc=C (sinusoidal
positions, an orthogonal projection, and per head query/key weights that
point it at the token 1, 2, ... places before or after, times C);
diagnostics that HF ALBERT cannot export: untie=1 (a separate decoder),
alibi=S (a fixed attention bias -S |i - j|, itself excluded);
relative positions: rel=key|key_query (Hugging Face's position_embedding_type
relative_key / relative_key_query: a learned distance embedding D of 2T - 1
rows by the head width, scores += q.D[i-j] (+ k.D[i-j]) after the 1/sqrt(d)
scale as HF's AlbertAttention, no absolute position embeddings; relstd [0.02] its initial std),
rel=bias (a learned scalar per head and distance, T5 without buckets, not
loadable by HF), rel=alibi (ALiBi's fixed slopes 2^-8h/NH, not loadable).

Every `every` steps one line: step, mean training loss (MLM + SOP), A
(accuracy over the masked positions of 128 held-out samples), X (their
MLM loss), M (accuracy on those whose input is [MASK]), U (always the most
frequent training id on the same [MASK] positions), t (seconds).
One thread, as bench_mlm_plateau.
"""
import math
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
torch.manual_seed(0)
a = dict(x.split("=", 1) for x in sys.argv[1:])
if "ids" not in a or "spec" not in a:
    sys.exit(__doc__)
V = int(a.get("V", 2000))
T = int(a.get("T", 32))
H = int(a.get("H", 128))
E = int(a.get("E", 128))
L = int(a.get("L", 2))
NH = 4
FF = int(a.get("F", 512))
B = int(a.get("B", 8))
steps = int(a.get("steps", 3000))
lr = float(a.get("lr", 1e-3))
warm = int(a.get("warm", 200))
every = int(a.get("every", 500))
sopw = float(a.get("sopw", 1.0))
MASK, CLS, SEP, PAD, UNK = [int(x) for x in a["spec"].split(",")]
ids = np.fromfile(a["ids"], dtype=np.int32)
ne = len(ids) // 50
tr, ev = ids[:-ne], ids[-ne:]
freq = np.bincount(tr, minlength=V)
cnt = freq.copy()
cnt[[MASK, CLS, SEP, PAD, UNK]] = 0
top = int(cnt.argmax())
n = T - 3


def build(raw, r):
    """[CLS] A [SEP] B [SEP] from each row of raw, swapped with p 0.5, masked."""
    Bn = raw.shape[0]
    x = np.zeros((Bn, T), np.int64)
    seg = np.zeros((Bn, T), np.int64)
    lab = np.full((Bn, T), -100, np.int64)
    sop = np.zeros(Bn, np.int64)
    for b in range(Bn):
        k = r.integers(n // 4, n - n // 4 + 1)
        A, Bs = raw[b, :k], raw[b, k:]
        if r.random() < 0.5:
            A, Bs = Bs, A
            sop[b] = 1
        s = np.concatenate([[CLS], A, [SEP], Bs, [SEP]])
        x[b] = s
        seg[b, len(A) + 2:] = 1
        ordinary = [i for i in range(T) if s[i] not in (CLS, SEP, MASK, PAD, UNK)]
        for i in r.choice(ordinary, max(1, round(0.15 * len(ordinary))), replace=False):
            lab[b, i] = s[i]
            u = r.random()
            if u < 0.8:
                x[b, i] = MASK
            elif u < 0.9:
                x[b, i] = r.integers(8, V)
    return [torch.from_numpy(v) for v in (x, seg, lab, sop)]


def sinusoids(om):
    P = torch.zeros(T, E)
    p = torch.arange(T, dtype=torch.float64)
    for k, w in enumerate(om):
        P[:, 2 * k] = torch.sin(w * p)
        P[:, 2 * k + 1] = torch.cos(w * p)
    return P / P.std()


class RelLayer(nn.Module):
    """torch's post-LN TransformerEncoderLayer (the same parameters and
    initial values) with the relative position scores that a["rel"] names."""

    def __init__(s):
        super().__init__()
        s.in_proj = nn.Linear(H, 3 * H)
        s.out_proj = nn.Linear(H, H)
        s.lin1, s.lin2 = nn.Linear(H, FF), nn.Linear(FF, H)
        s.norm1, s.norm2 = nn.LayerNorm(H, eps=1e-12), nn.LayerNorm(H, eps=1e-12)
        s.kind = a["rel"]
        r = torch.arange(T)
        s.register_buffer("dist", r[:, None] - r[None, :] + T - 1)  # i - j + T - 1
        if s.kind in ("key", "key_query"):
            s.D = nn.Parameter(torch.zeros(2 * T - 1, H // NH))
        elif s.kind == "bias":
            s.D = nn.Parameter(torch.zeros(NH, 2 * T - 1))
        elif s.kind == "alibi":
            sl = torch.tensor([2.0 ** (-8.0 * (h + 1) / NH) for h in range(NH)])
            s.register_buffer("fixed", -sl[:, None, None] * (r[:, None] - r[None, :]).abs().float())
        else:
            sys.exit("rel: key, key_query, bias or alibi")

    def forward(s, x):
        Bn, d = x.shape[0], H // NH
        q, k, v = s.in_proj(x).view(Bn, T, 3, NH, d).permute(2, 0, 3, 1, 4)
        sc = q @ k.transpose(-1, -2) / math.sqrt(d)  # B NH T T
        if s.kind in ("key", "key_query"):
            # HF AlbertAttention adds these after the 1/sqrt(d) scale
            # (BertSelfAttention before it)
            P = s.D[s.dist]  # T T d
            sc = sc + torch.einsum("bhld,lrd->bhlr", q, P)
            if s.kind == "key_query":
                sc = sc + torch.einsum("bhrd,lrd->bhlr", k, P)
        if s.kind == "bias":
            sc = sc + s.D[:, s.dist]
        elif s.kind == "alibi":
            sc = sc + s.fixed
        o = (sc.softmax(-1) @ v).transpose(1, 2).reshape(Bn, T, H)
        x = s.norm1(x + s.out_proj(o))
        return s.norm2(x + s.lin2(F.gelu(s.lin1(x))))


class Model(nn.Module):
    def __init__(s):
        super().__init__()
        s.word = nn.Embedding(V, E)
        s.pos = nn.Embedding(T, E)
        s.typ = nn.Embedding(2, E)
        s.eln = nn.LayerNorm(E, eps=1e-12)
        s.proj = nn.Linear(E, H)
        if "rel" in a:
            s.layer = RelLayer()
        else:
            s.layer = nn.TransformerEncoderLayer(H, NH, FF, dropout=0.0, activation="gelu",
                                                 batch_first=True, layer_norm_eps=1e-12)
        s.pool = nn.Linear(H, H)
        s.sop = nn.Linear(H, 2)
        s.md = nn.Linear(H, E)
        s.mln = nn.LayerNorm(E, eps=1e-12)
        s.mb = nn.Parameter(torch.zeros(V))
        s.dec = nn.Embedding(V, E)
        for mod in s.modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, std=0.02)
                if getattr(mod, "bias", None) is not None:
                    nn.init.zeros_(mod.bias)
        for nm, p in s.layer.named_parameters():
            if nm == "D":
                nn.init.normal_(p, std=float(a.get("relstd", 0.02)) if p.shape[0] != NH else 0.0)
            elif p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            elif "norm" not in nm:
                nn.init.zeros_(p)
        posstd = float(a.get("posstd", 0.02))
        with torch.no_grad():
            if a.get("pos", "normal") == "sin":
                s.pos.weight.copy_(sinusoids([10000 ** (-2 * k / E) for k in range(E // 2)]) * posstd)
            else:
                s.pos.weight.normal_(0, posstd)
            if "wordstd" in a:
                s.word.weight.normal_(0, float(a["wordstd"]))
            W = s.layer.in_proj.weight if "rel" in a else s.layer.self_attn.in_proj_weight
            if "mim" in a:
                q = torch.randn(H, H) / math.sqrt(H) * float(a["mim"])
                W[:H].copy_(q)
                W[H:2 * H].copy_(q)
            if "loc" in a:
                c, npair, d = float(a["loc"]), E // 2, H // NH
                om = [math.pi * (k + 1) / npair for k in range(npair)]
                s.pos.weight.copy_(sinusoids(om) * posstd)
                Q, _ = torch.linalg.qr(torch.randn(H, E))
                Wp = Q * 0.02 * math.sqrt(H)
                s.proj.weight.copy_(Wp)
                s2 = (0.02 * math.sqrt(H)) ** 2
                offs = [-1, 1, -2, 2, -3, 3, -4, 4]
                for h in range(NH):
                    o = offs[h % len(offs)]
                    RS, S = torch.zeros(d, E), torch.zeros(d, E)
                    for j, k in enumerate([k for k in range(npair) if k % NH == h][: d // 2]):
                        # the query's pair is the position o places on
                        cw, sw = math.cos(om[k] * o), math.sin(om[k] * o)
                        RS[2 * j, 2 * k], RS[2 * j, 2 * k + 1] = cw, sw
                        RS[2 * j + 1, 2 * k], RS[2 * j + 1, 2 * k + 1] = -sw, cw
                        S[2 * j, 2 * k] = S[2 * j + 1, 2 * k + 1] = 1
                    W[h * d:(h + 1) * d].copy_(c * RS @ Wp.t() / s2)
                    W[H + h * d:H + (h + 1) * d].copy_(c * S @ Wp.t() / s2)
            if a.get("ubias") == "1":
                lp = np.log((freq + 1.0) / (freq.sum() + V))
                s.mb.copy_(torch.tensor(lp - lp.mean(), dtype=torch.float32))
        s.bias = None
        if "alibi" in a:
            r = torch.arange(T)
            s.bias = -float(a["alibi"]) * (r[None] - r[:, None]).abs().float()
            s.bias.fill_diagonal_(-1e4)

    def forward(s, x, seg):
        pos = 0 if "rel" in a else s.pos.weight[None]
        h = s.proj(s.eln(s.word(x) + pos + s.typ(seg)))
        for _ in range(L):
            h = s.layer(h) if "rel" in a else s.layer(h, src_mask=s.bias)
        m = s.mln(F.gelu(s.md(h), approximate="tanh"))
        dec = s.dec.weight if a.get("untie") == "1" else s.word.weight
        return m @ dec.t() + s.mb, s.sop(torch.tanh(s.pool(h[:, 0])))


class Lamb(torch.optim.Optimizer):
    """kernels/optimizer.c's LAMB: Adam's update plus decoupled decay, times
    the tensor's trust ratio |w| / |u| for tensors of 2 dimensions."""

    def __init__(s, params, lr):
        super().__init__(params, dict(lr=lr, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01))

    @torch.no_grad()
    def step(s):
        for g in s.param_groups:
            b1, b2 = g["betas"]
            for p in g["params"]:
                if p.grad is None:
                    continue
                st = s.state[p]
                if not st:
                    st.update(t=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
                st["t"] += 1
                t = st["t"]
                st["m"].mul_(b1).add_(p.grad, alpha=1 - b1)
                st["v"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                u = (st["m"] / (1 - b1 ** t)) / ((st["v"] / (1 - b2 ** t)).sqrt() + g["eps"])
                r = 1.0
                if p.dim() > 1:
                    u = u + g["weight_decay"] * p
                    wn, un = p.norm(), u.norm()
                    if wn > 0 and un > 0:
                        r = (wn / un).item()
                p.add_(u, alpha=-g["lr"] * r)


m = Model()
if a.get("opt", "adamw") == "lamb":
    opt = Lamb(m.parameters(), lr)
else:
    opt = torch.optim.AdamW(m.parameters(), lr=lr, betas=(0.9, 0.98),
                            eps=float(a.get("eps", 1e-6)), weight_decay=0.01)


def lr_at(s):
    if s < warm:
        return lr * (s + 1) / warm
    q = min(1, (s - warm) / max(1, steps - warm))
    return lr * (0.1 + 0.9 * (1 + math.cos(math.pi * q)) / 2)


rng = np.random.default_rng(1)
evb = build(ev[:128 * n].reshape(128, n), np.random.default_rng(99))
nb = len(tr) // n // B
ls, t0 = 0.0, time.time()
for s in range(steps):
    for g in opt.param_groups:
        g["lr"] = lr_at(s)
    i = (s % nb) * B
    x, seg, lab, sop = build(tr[i * n:(i + B) * n].reshape(B, n), rng)
    lg, sl = m(x, seg)
    loss = F.cross_entropy(lg.view(-1, V), lab.view(-1)) + sopw * F.cross_entropy(sl, sop)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    ls += loss.item()
    if (s + 1) % every == 0:
        with torch.no_grad():
            x, seg, lab, _ = evb
            lg, _ = m(x, seg)
            k = lab != -100
            mk = k & (x == MASK)
            acc = (lg[k].argmax(-1) == lab[k]).float().mean().item()
            el = F.cross_entropy(lg[k], lab[k]).item()
            macc = (lg[mk].argmax(-1) == lab[mk]).float().mean().item()
            uni = (lab[mk] == top).float().mean().item()
        print("step %d loss %.4f A %.4f X %.4f M %.4f U %.4f t %.0f"
              % (s + 1, ls / every, acc, el, macc, uni, time.time() - t0), flush=True)
        ls = 0.0
