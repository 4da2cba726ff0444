#!/usr/bin/python3
"""cotrain tests: is an exported folder exactly GPT-2?

    gpt2_reference.py DIR TEXT LOGITS              our own GPT-2 forward
    gpt2_reference.py --transformers DIR TEXT LOGITS   GPT2LMHeadModel

Loads DIR/config.json and DIR/model.safetensors by the GPT-2 names only (no
cotrain code; the safetensors file is parsed here), runs the first n_positions
bytes of TEXT (token = byte) through a GPT-2 forward written from the GPT-2
paper's definition in float64 (or through transformers' GPT2LMHeadModel), and
compares the logits with LOGITS, cotrain's own float32 logits
[n_positions, vocab_size].  Prints one line; exit 0 when the largest
difference is within 1e-4 of the largest logit, 1 when not, 3 when
transformers cannot be imported (the reason on stdout), 2 on bad input.
"""
import json
import math
import struct
import sys

import torch


def load_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for name, t in header.items():
        if t["dtype"] != "F32":
            raise SystemExit(f"{name}: dtype {t['dtype']}, expected F32")
        b, e = t["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[b:e]), dtype=torch.float32).reshape(t["shape"])
    return meta, out


def expected_names(cfg):
    names = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"}
    for i in range(cfg["n_layer"]):
        for s in ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                  "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                  "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"):
            names.add(f"h.{i}.{s}")
    return names


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gpt2_forward(cfg, w, ids):
    """GPT-2: token + position embeddings, pre-LN blocks, tied head."""
    T, C, H = len(ids), cfg["n_embd"], cfg["n_head"]
    hd, eps = C // H, cfg["layer_norm_epsilon"]
    w = {k: v.double() for k, v in w.items()}

    def ln(x, p):
        return torch.nn.functional.layer_norm(x, (C,), w[p + ".weight"], w[p + ".bias"], eps)

    def conv1d(x, p):  # GPT-2's Conv1D: y = x W + b, W is [in, out]
        return x @ w[p + ".weight"] + w[p + ".bias"]

    x = w["wte.weight"][ids] + w["wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(cfg["n_layer"]):
        h = f"h.{i}."
        q, k, v = conv1d(ln(x, h + "ln_1"), h + "attn.c_attn").split(C, dim=-1)
        q, k, v = (t.view(T, H, hd).transpose(0, 1) for t in (q, k, v))  # [H, T, hd]
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(0, 1).reshape(T, C)
        x = x + conv1d(y, h + "attn.c_proj")
        x = x + conv1d(gelu_new(conv1d(ln(x, h + "ln_2"), h + "mlp.c_fc")), h + "mlp.c_proj")
    return ln(x, "ln_f") @ w["wte.weight"].T  # tied head, no bias


def bytes_to_unicode():
    """GPT-2's table (openai/gpt-2 encoder.py): byte -> printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def check_tokenizer(d, vocab_size):
    """tokenizer.json is a byte-level BPE without merges whose id is the byte."""
    with open(f"{d}/tokenizer.json") as f:
        tok = json.load(f)
    m = tok["model"]
    want = {c: b for b, c in bytes_to_unicode().items()}
    if vocab_size != 256 or m["type"] != "BPE" or m["merges"] != [] or m["vocab"] != want or \
            tok["pre_tokenizer"]["type"] != "ByteLevel" or tok["decoder"]["type"] != "ByteLevel":
        return "tokenizer.json is not the byte tokenizer (id = byte value)"
    return None


def main(argv):
    use_tf = argv[:1] == ["--transformers"]
    if use_tf:
        argv = argv[1:]
    if len(argv) != 3:
        print(__doc__)
        return 2
    d, text_path, logits_path = argv
    with open(f"{d}/config.json") as f:
        cfg = json.load(f)
    want = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
            "activation_function": "gelu_new", "tie_word_embeddings": True,
            "resid_pdrop": 0, "embd_pdrop": 0, "attn_pdrop": 0}
    for k, v in want.items():
        if cfg.get(k) != v:
            print(f"config.json: {k} is {cfg.get(k)!r}, expected {v!r}")
            return 1
    for k in ("n_layer", "n_embd", "n_head", "n_inner", "n_positions", "n_ctx", "vocab_size",
              "layer_norm_epsilon", "bos_token_id", "eos_token_id"):
        if k not in cfg:
            print(f"config.json: {k} is missing")
            return 1
    bad = check_tokenizer(d, cfg["vocab_size"])
    if bad:
        print(bad)
        return 1
    meta, w = load_safetensors(f"{d}/model.safetensors")
    if meta.get("format") != "pt":
        print(f"model.safetensors: metadata format is {meta.get('format')!r}, expected 'pt'")
        return 1
    if set(w) != expected_names(cfg):
        print(f"model.safetensors: names differ from GPT-2's: extra {sorted(set(w) - expected_names(cfg))[:5]},"
              f" missing {sorted(expected_names(cfg) - set(w))[:5]}")
        return 1
    T, V = cfg["n_positions"], cfg["vocab_size"]
    with open(text_path, "rb") as f:
        ids = list(f.read(T))
    if len(ids) < T:
        print(f"{text_path}: fewer than {T} bytes")
        return 2
    with open(logits_path, "rb") as f:
        ours = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).double()
    if ours.numel() != T * V:
        print(f"{logits_path}: {ours.numel()} floats, expected {T * V}")
        return 2
    ours = ours.view(T, V)

    if use_tf:
        try:
            from transformers import GPT2LMHeadModel
        except ImportError as e:
            print(f"transformers cannot be imported ({e})")
            return 3
        model = GPT2LMHeadModel.from_pretrained(d).eval()
        with torch.no_grad():
            ref = model(torch.tensor([ids])).logits[0].double()
        what = "transformers GPT2LMHeadModel"
    else:
        with torch.no_grad():
            ref = gpt2_forward(cfg, w, torch.tensor(ids))
        what = "a float64 GPT-2 forward"
    err = (ours - ref).abs().max().item() / ref.abs().max().item()
    ok = err <= 1e-4
    print(f"logits of {T} bytes against {what}: max |difference| / max |logit| = {err:.3g}"
          f" ({'within' if ok else 'above'} 1e-4)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
