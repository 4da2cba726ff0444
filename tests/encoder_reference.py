#!/usr/bin/python3
"""Write tests/data/encoder_reference.bin: what PyTorch computes for two
tiny cotrain encoders (kernels/encoder.h), for tests/test_encoder_torch.c to
match.

Run with a python3 that has torch (Debian's python3-torch):
    /usr/bin/python3 tests/encoder_reference.py tests/data/encoder_reference.bin

The encoder is written out here from Hugging Face's AlbertForPreTraining and
BertForPreTraining (modeling_albert.py, modeling_bert.py), op by op, on
weights in cotrain's parameter layout (kernels/encoder.h: linear weights
[in, out], q, k, v fused column-wise, block l uses set l * n_shared //
n_layer), without any cotrain code: F.layer_norm with eps 1e-12, GELU tanh
(ALBERT's gelu_new) or erf (BERT's gelu), unmasked softmax attention,
post-LN residuals, the MLM head tied to the word embedding with its own
bias, the pooler (tanh) and the two-way sentence-order head on [CLS], and
the loss masked_lm_loss + sentence_order_loss with ignore_index -100.

Everything runs in float64 from float32 weights and batch (which are what
is written), so the reference carries no float32 rounding of its own; the
test compares cotrain's float32 results with it.

Case "albert": L=2 S=1 (one shared set), NH=2, H=16, E=8, F=32, T=12,
V=40, B=3.  Case "bert": L=2 S=2, NH=2, H=16, E=16, F=32, T=12, V=40, B=3.
Cases "albert_relative_key" and "bert_relative_key_query": the same shapes
with Hugging Face's relative positions (position_embedding_type): no
position row added to the embeddings, and each set's distance embedding
layer.s.attn.distance.weight [2T-1, H/NH] adding q_i . D[i-j+T-1]
(+ k_j . D[i-j+T-1]) to the scores, after the 1/sqrt(H/NH) scale in
AlbertAttention, before it in BertSelfAttention.
Records per case: config, ids, segments, labels, sop, param.<view>,
loss, mlm_loss, sop_loss, mlm_logits (the labelled rows, in (b, t) order),
sop_logits, full_logits (every position, from a forward without labels),
grad.<view>.

File format (little-endian): magic b"CTREF001", uint32 record count, then per
record: uint32 name length, name, uint32 dtype (0 float32, 1 int32), uint32
ndim, uint32 shape[ndim], the data.
"""
import math
import sys

import torch
import torch.nn.functional as F

from gen_torch_reference import Writer  # the file format, shared with the GPT's references

torch.set_num_threads(1)
EPS = 1e-12
IGNORE = -100
ALBERT, BERT = 1, 2
ABSOLUTE, RELATIVE_KEY, RELATIVE_KEY_QUERY = 0, 1, 2


def views(cfg):
    arch, L, S, NH, H, E, Fd, T, V, TV = (cfg[k] for k in
                                           ("arch", "L", "S", "NH", "H", "E", "F", "T", "V", "TV"))
    out = [("emb.word", (V, E)), ("emb.position", (T, E)), ("emb.token_type", (TV, E)),
           ("emb.ln.weight", (E,)), ("emb.ln.bias", (E,))]
    if arch == ALBERT:
        out += [("emb.proj.weight", (E, H)), ("emb.proj.bias", (H,))]
    for s in range(S):
        p = "layer.%d." % s
        out += [(p + "attn.qkv.weight", (H, 3 * H)), (p + "attn.qkv.bias", (3 * H,)),
                (p + "attn.out.weight", (H, H)), (p + "attn.out.bias", (H,)),
                (p + "attn.ln.weight", (H,)), (p + "attn.ln.bias", (H,)),
                (p + "ffn.weight", (H, Fd)), (p + "ffn.bias", (Fd,)),
                (p + "ffn_out.weight", (Fd, H)), (p + "ffn_out.bias", (H,)),
                (p + "ln.weight", (H,)), (p + "ln.bias", (H,))]
        if cfg.get("pos", ABSOLUTE) != ABSOLUTE:
            out += [(p + "attn.distance.weight", (2 * cfg["T"] - 1, H // NH))]
    out += [("pooler.weight", (H, H)), ("pooler.bias", (H,)), ("sop.weight", (H, 2)), ("sop.bias", (2,)),
            ("mlm.dense.weight", (H, E)), ("mlm.dense.bias", (E,)), ("mlm.ln.weight", (E,)),
            ("mlm.ln.bias", (E,)), ("mlm.bias", (V,))]
    return out


def init_params(cfg):
    params = {}
    for name, shape in views(cfg):
        if len(shape) == 1:
            # near 1 or 0 but not exactly, so that every path is exercised
            base = 1.0 if name.endswith("ln.weight") else 0.0
            t = base + 0.1 * torch.randn(shape)
        else:
            t = 0.3 * torch.randn(shape) if name.startswith("emb.") else torch.randn(shape) / math.sqrt(shape[0])
        params[name] = t.float().double().requires_grad_(True)
    return params


def gelu(x, arch):
    return F.gelu(x, approximate="tanh" if arch == ALBERT else "none")


def forward(cfg, P, ids, seg, labels, sop):
    """Returns (mlm_logits at the labelled rows or every row, sop_logits,
    loss, mlm_loss, sop_loss); the losses are None without labels."""
    arch, L, S, NH, H, E = (cfg[k] for k in ("arch", "L", "S", "NH", "H", "E"))
    B, T = ids.shape
    hd = H // NH
    x = P["emb.word"][ids] + P["emb.token_type"][seg]
    pos = cfg.get("pos", ABSOLUTE)
    if pos == ABSOLUTE:
        x = x + P["emb.position"][:T].unsqueeze(0)
    x = F.layer_norm(x, (E,), P["emb.ln.weight"], P["emb.ln.bias"], EPS)
    if arch == ALBERT:
        x = x @ P["emb.proj.weight"] + P["emb.proj.bias"]
    for l in range(L):
        p = "layer.%d." % (l * S // L)
        qkv = x @ P[p + "attn.qkv.weight"] + P[p + "attn.qkv.bias"]
        q, k, v = qkv.split(H, dim=2)
        q = q.view(B, T, NH, hd).transpose(1, 2)
        k = k.view(B, T, NH, hd).transpose(1, 2)
        v = v.view(B, T, NH, hd).transpose(1, 2)
        s = q @ k.transpose(2, 3)
        if pos == ABSOLUTE:
            s = s / math.sqrt(hd)
        else:
            i = torch.arange(T)
            D = P[p + "attn.distance.weight"][i[:, None] - i[None, :] + T - 1]  # [T, T, hd]
            r = torch.einsum("bhld,lrd->bhlr", q, D)
            if pos == RELATIVE_KEY_QUERY:
                r = r + torch.einsum("bhrd,lrd->bhlr", k, D)
            s = s / math.sqrt(hd) + r if arch == ALBERT else (s + r) / math.sqrt(hd)
        att = torch.softmax(s, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, H)
        y = y @ P[p + "attn.out.weight"] + P[p + "attn.out.bias"]
        x = F.layer_norm(x + y, (H,), P[p + "attn.ln.weight"], P[p + "attn.ln.bias"], EPS)
        h = gelu(x @ P[p + "ffn.weight"] + P[p + "ffn.bias"], arch)
        h = h @ P[p + "ffn_out.weight"] + P[p + "ffn_out.bias"]
        x = F.layer_norm(x + h, (H,), P[p + "ln.weight"], P[p + "ln.bias"], EPS)
    pooled = torch.tanh(x[:, 0] @ P["pooler.weight"] + P["pooler.bias"])
    sop_logits = pooled @ P["sop.weight"] + P["sop.bias"]
    flat = x.reshape(B * T, H)
    if labels is not None:
        rows = (labels.reshape(-1) != IGNORE).nonzero().squeeze(1)
        flat = flat[rows]
    m = gelu(flat @ P["mlm.dense.weight"] + P["mlm.dense.bias"], arch)
    m = F.layer_norm(m, (E,), P["mlm.ln.weight"], P["mlm.ln.bias"], EPS)
    logits = m @ P["emb.word"].t() + P["mlm.bias"]
    if labels is None:
        return logits, sop_logits, None, None, None
    mlm_loss = F.cross_entropy(logits, labels.reshape(-1)[rows])
    sop_loss = F.cross_entropy(sop_logits, sop)
    return logits, sop_logits, mlm_loss + sop_loss, mlm_loss, sop_loss


CONFIG_KEYS = ("arch", "L", "S", "NH", "H", "E", "F", "T", "V", "TV", "cls", "sep", "mask", "pad", "pos")


def case(w, tag, cfg, B):
    T, V = cfg["T"], cfg["V"]
    P = init_params(cfg)
    ids = torch.randint(4, V, (B, T))
    ids[:, 0] = cfg["cls"]
    seg = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        cut = 3 + b
        ids[b, cut] = cfg["sep"]
        ids[b, T - 1] = cfg["sep"]
        seg[b, cut + 1:] = 1
    labels = torch.full((B, T), IGNORE, dtype=torch.long)
    for b in range(B):
        for t in (1 + b, 5, T - 2 - b):
            labels[b, t] = int(ids[b, t])
            ids[b, t] = cfg["mask"] if t != 5 else int(torch.randint(4, V, (1,)))
    sop = torch.randint(0, 2, (B,))
    logits, sop_logits, loss, mlm_loss, sop_loss = forward(cfg, P, ids, seg, labels, sop)
    loss.backward()
    with torch.no_grad():
        full, _, _, _, _ = forward(cfg, P, ids, seg, None, None)
    w.i32(tag + ".config", [cfg[k] for k in CONFIG_KEYS])
    w.i32(tag + ".ids", ids)
    w.i32(tag + ".segments", seg)
    w.i32(tag + ".labels", labels)
    w.i32(tag + ".sop", sop)
    for name, _ in views(cfg):
        w.f32(tag + ".param." + name, P[name])
    w.f32(tag + ".loss", [loss.item()])
    w.f32(tag + ".mlm_loss", [mlm_loss.item()])
    w.f32(tag + ".sop_loss", [sop_loss.item()])
    w.f32(tag + ".mlm_logits", logits)
    w.f32(tag + ".sop_logits", sop_logits)
    w.f32(tag + ".full_logits", full)
    for name, _ in views(cfg):
        # emb.position is not read with relative positions: no gradient
        g = P[name].grad
        w.f32(tag + ".grad." + name, g if g is not None else torch.zeros_like(P[name]))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: encoder_reference.py OUTPUT")
    torch.manual_seed(24)
    w = Writer()
    base = dict(L=2, NH=2, H=16, F=32, T=12, V=40, TV=2, cls=0, sep=1, mask=2, pad=3, pos=ABSOLUTE)
    case(w, "albert", dict(base, arch=ALBERT, S=1, E=8), 3)
    case(w, "bert", dict(base, arch=BERT, S=2, E=16), 3)
    case(w, "albert_relative_key", dict(base, arch=ALBERT, S=1, E=8, pos=RELATIVE_KEY), 3)
    case(w, "bert_relative_key_query", dict(base, arch=BERT, S=2, E=16, pos=RELATIVE_KEY_QUERY), 3)
    w.save(sys.argv[1])


if __name__ == "__main__":
    main()
