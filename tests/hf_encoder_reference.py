#!/usr/bin/python3
"""Check an encoder exported by cotrain (kernels/hf_albert.h) against
cotrain's own MLM logits, reading the folder by Hugging Face's names only.

    hf_encoder_reference.py DIR DATA

DIR holds config.json and model.safetensors (AlbertForPreTraining or
BertForPreTraining names); DATA is what tests/encoder_export_tool.c writes:
int32 B, T, V, int32 ids[B*T], int32 segments[B*T], float32 logits[B*T*V].

The forward below is written from transformers' modeling_albert.py and
modeling_bert.py (nn.Linear weights [out, in], separate query/key/value,
post-LN blocks, layer l of ALBERT using group l // (L / num_hidden_groups),
position_embedding_type absolute (position embeddings added to the input)
or relative_key / relative_key_query (none added; each attention's
distance_embedding D[2 max_position_embeddings - 1, head width] adds
q_i . D[i-j] (+ k_j . D[i-j]) to the scores, after the 1/sqrt(head width)
scale in AlbertAttention, before it in BertSelfAttention),
the MLM head dense -> activation -> LayerNorm -> decoder + bias), on the
tensors named there, in float64.  It shares no code with cotrain or with
tests/encoder_reference.py.  The MLM logits must agree within 1e-4 relative
(max |ours - cotrain| / max |cotrain|).  When transformers can be imported,
AlbertForPreTraining / BertForPreTraining.from_pretrained(DIR) must agree
too; otherwise a line "SKIP transformers: ..." says why.  Exit status 0 when
every check that ran passed."""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F

TOL = 1e-4
DTYPES = {"F32": torch.float32}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[a:b]), dtype=DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"]).double()
    return out


def read_data(path):
    with open(path, "rb") as f:
        B, T, V = struct.unpack("<3i", f.read(12))
        ids = torch.tensor(struct.unpack("<%di" % (B * T), f.read(4 * B * T))).reshape(B, T)
        seg = torch.tensor(struct.unpack("<%di" % (B * T), f.read(4 * B * T))).reshape(B, T)
        logits = torch.frombuffer(bytearray(f.read(4 * B * T * V)), dtype=torch.float32).reshape(B, T, V)
    return ids, seg, logits.double()


def act(x, name):
    if name == "gelu_new":
        return F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu(x)
    raise SystemExit("unexpected hidden_act %s" % name)


def linear(W, name, x):
    return x @ W[name + ".weight"].t() + W[name + ".bias"]


def ln(W, name, x, eps):
    return F.layer_norm(x, (x.shape[-1],), W[name + ".weight"], W[name + ".bias"], eps)


def attention(W, p, x, cfg, albert):
    B, T, H = x.shape
    nh, pos = cfg["num_attention_heads"], cfg.get("position_embedding_type", "absolute")
    hd = H // nh
    q, k, v = (linear(W, p + n, x).view(B, T, nh, hd).transpose(1, 2) for n in ("query", "key", "value"))
    s = q @ k.transpose(2, 3)
    r = 0
    if pos in ("relative_key", "relative_key_query"):
        i = torch.arange(T)
        D = W[p + "distance_embedding.weight"][i[:, None] - i[None, :] + cfg["max_position_embeddings"] - 1]
        r = torch.einsum("bhld,lrd->bhlr", q, D)
        if pos == "relative_key_query":
            r = r + torch.einsum("bhrd,lrd->bhlr", k, D)
    elif pos != "absolute":
        raise SystemExit("unexpected position_embedding_type %s" % pos)
    s = s / math.sqrt(hd) + r if albert else (s + r) / math.sqrt(hd)
    return (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, H)


def forward(cfg, W, ids, seg):
    albert = cfg["model_type"] == "albert"
    base = "albert" if albert else "bert"
    eps, hact, nh, L = cfg["layer_norm_eps"], cfg["hidden_act"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    T = ids.shape[1]
    e = W[base + ".embeddings.word_embeddings.weight"][ids] + W[base + ".embeddings.token_type_embeddings.weight"][seg]
    if cfg.get("position_embedding_type", "absolute") == "absolute":
        e = e + W[base + ".embeddings.position_embeddings.weight"][:T]
    x = ln(W, base + ".embeddings.LayerNorm", e, eps)
    if albert:
        x = linear(W, "albert.encoder.embedding_hidden_mapping_in", x)
        G = cfg["num_hidden_groups"]
        for l in range(L):
            g = "albert.encoder.albert_layer_groups.%d.albert_layers.0." % int(l / (L / G))
            a = linear(W, g + "attention.dense", attention(W, g + "attention.", x, cfg, True))
            x = ln(W, g + "attention.LayerNorm", x + a, eps)
            h = linear(W, g + "ffn_output", act(linear(W, g + "ffn", x), hact))
            x = ln(W, g + "full_layer_layer_norm", x + h, eps)
        m = ln(W, "predictions.LayerNorm", act(linear(W, "predictions.dense", x), hact), eps)
        return m @ W["albert.embeddings.word_embeddings.weight"].t() + W["predictions.bias"]
    for l in range(L):
        p = "bert.encoder.layer.%d." % l
        a = linear(W, p + "attention.output.dense", attention(W, p + "attention.self.", x, cfg, False))
        x = ln(W, p + "attention.output.LayerNorm", x + a, eps)
        h = linear(W, p + "output.dense", act(linear(W, p + "intermediate.dense", x), hact))
        x = ln(W, p + "output.LayerNorm", x + h, eps)
    m = ln(W, "cls.predictions.transform.LayerNorm", act(linear(W, "cls.predictions.transform.dense", x), hact), eps)
    return m @ W["bert.embeddings.word_embeddings.weight"].t() + W["cls.predictions.bias"]


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: hf_encoder_reference.py DIR DATA")
    d, data = sys.argv[1], sys.argv[2]
    cfg = json.load(open(d + "/config.json"))
    W = read_safetensors(d + "/model.safetensors")
    ids, seg, want = read_data(data)
    got = forward(cfg, W, ids, seg)
    e = rel(got, want)
    good = e <= TOL
    print("%s: logits from the HF names alone, relative error %.3g" % ("ok" if good else "FAIL", e))
    try:
        import transformers
    except ImportError as ex:
        print("SKIP transformers: cannot be imported (%s)" % ex)
        return 0 if good else 1
    cls = transformers.AlbertForPreTraining if cfg["model_type"] == "albert" else transformers.BertForPreTraining
    model = cls.from_pretrained(d).eval()
    with torch.no_grad():
        out = model(input_ids=ids.long(), token_type_ids=seg.long()).prediction_logits.double()
    e2 = rel(out, want)
    print("%s: transformers %s logits, relative error %.3g" % ("ok" if e2 <= TOL else "FAIL", cls.__name__, e2))
    return 0 if good and e2 <= TOL else 1


if __name__ == "__main__":
    sys.exit(main())
