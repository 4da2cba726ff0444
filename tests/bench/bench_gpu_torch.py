#!/usr/bin/python3
"""The PyTorch side of tests/bench/bench_gpu.c, on the same GPU: the same
GPT-style model (pre-LN blocks, causal attention through
scaled_dot_product_attention, tanh GELU, tied head), batch and sequence,
timed over forward and backward (what bench_gpu times: the optimizer step
stays on the CPU in cotrain), median of the steps after warm-ups, with
device events.  Prints one line per mode like bench_gpu.

    bench_gpu_torch.py [--model gpt2|gpt2-bytes|sahaj|sahajbert|demo] [--batch B]
                       [--steps N] [--modes eager-bf16,eager-fp32,compile-bf16]

eager-bf16: autocast to bf16 (PyTorch's mixed precision); eager-fp32: fp32
with TF32 off; eager-tf32: fp32 with TF32 products; compile-bf16:
torch.compile of the model under bf16 autocast.

sahajbert is Hugging Face's AlbertForPreTraining (transformers) at
sahajBERT's sizes, dropout off, its attention SDPA where the installed
version offers it, trained as cotrain trains it: the MLM head on the
predicted positions only (15% of the T - 3 tokens a sample holds, as
kernels/masking.c picks) plus sentence order on the pooled [CLS] row.
(AlbertForPreTraining's own forward would compute logits at every
position, 6.7 times the head's work.)
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPES = {  # L, S(unused: sharing does not change the work), NH, C, Fd, T, V, B
    "gpt2": (12, 12, 768, 3072, 1024, 50257, 16),
    "gpt2-bytes": (12, 12, 768, 3072, 1024, 256, 16),
    "sahaj": (24, 16, 1024, 4096, 512, 32000, 16),
    "demo": (4, 4, 256, 1024, 256, 256, 16),
    "sahajbert": (24, 16, 1024, 4096, 512, 32000, 16),
}
EMBED = 128  # sahajbert's factorised embedding


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

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.NH
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.NH, hd).transpose(1, 2)
        k = k.view(B, T, self.NH, hd).transpose(1, 2)
        v = v.view(B, T, self.NH, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, NH, C, T, V, Fd):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, NH, Fd) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for blk in self.h:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def flops_per_sample(L, C, Fd, T, V):
    """kern_flops_per_sample: the matrix products, causal attention halved."""
    fwd = L * (2 * T * (3 * C * C + C * C + 2 * C * Fd) + 2 * C * T * (T + 1)) + 2 * T * C * V
    return 3 * fwd


def enc_flops_per_sample(L, C, Fd, T, V, E):
    """kern_enc_flops_per_sample (kernels/encoder.c) for an absolute-position ALBERT."""
    P = max(1, round(0.15 * (T - 3)))
    fwd = L * (2 * T * (3 * C * C + C * C + 2 * C * Fd) + 4 * T * T * C) + 2 * P * (C * E + E * V)
    fwd += 2 * (C * C + 2 * C) + 2 * T * E * C
    return 3 * fwd


class AlbertPretraining(nn.Module):
    """AlbertForPreTraining's modules, the MLM head on the predicted rows."""

    def __init__(self, L, NH, C, T, V, Fd):
        super().__init__()
        from transformers import AlbertConfig, AlbertForPreTraining
        cfg = AlbertConfig(vocab_size=V, embedding_size=EMBED, hidden_size=C, num_hidden_layers=L,
                           num_hidden_groups=1, num_attention_heads=NH, intermediate_size=Fd,
                           hidden_act="gelu_new", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                           classifier_dropout_prob=0.0, max_position_embeddings=T, type_vocab_size=2,
                           layer_norm_eps=1e-12)
        try:
            self.m = AlbertForPreTraining._from_config(cfg, attn_implementation="sdpa")
        except Exception:
            self.m = AlbertForPreTraining(cfg)
        self.attn = getattr(self.m.config, "_attn_implementation", "?")

    def forward(self, ids, segs, rows, tgt, sop):
        seq, pooled = self.m.albert(input_ids=ids, token_type_ids=segs, return_dict=False)[:2]
        logits = self.m.predictions(seq.reshape(-1, seq.shape[-1])[rows])
        sop_logits = self.m.sop_classifier(pooled)
        return F.cross_entropy(logits.float(), tgt) + F.cross_entropy(sop_logits.float(), sop)


def run(mode, args, shape):
    L, NH, C, Fd, T, V, B = shape
    B = args.batch or B
    torch.backends.cuda.matmul.allow_tf32 = mode == "eager-tf32"
    torch.backends.cudnn.allow_tf32 = mode == "eager-tf32"
    enc = args.model == "sahajbert"
    model = (AlbertPretraining if enc else GPT)(L, NH, C, T, V, Fd).cuda().train()
    step_model = torch.compile(model) if mode.startswith("compile") else model
    amp = mode.endswith("bf16")
    idx = torch.randint(0, V, (B, T), device="cuda")
    tgt = torch.randint(0, V, (B, T), device="cuda")
    inputs = (idx, tgt)
    note = ""
    if enc:
        P = max(1, round(0.15 * (T - 3)))
        rows = torch.cat([b * T + 1 + torch.randperm(T - 2, device="cuda")[:P] for b in range(B)])
        segs = (torch.arange(T, device="cuda") >= T // 2).long().expand(B, T).contiguous()
        inputs = (idx, segs, rows, torch.randint(0, V, (B * P,), device="cuda"),
                  torch.randint(0, 2, (B,), device="cuda"))
        note = f"; attention {model.attn}"
    times = []
    t0 = time.time()
    for s in range(args.steps + 3):
        model.zero_grad(set_to_none=True)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = step_model(*inputs)
        loss.backward()
        e1.record()
        torch.cuda.synchronize()
        if s >= 3:
            times.append(e0.elapsed_time(e1))
        if s == 2:
            warm = time.time() - t0
    times.sort()
    ms = times[len(times) // 2]
    peak = 989e12 if amp else 495e12 if mode == "eager-tf32" else 67e12
    fl = (enc_flops_per_sample(L, C, Fd, T, V, EMBED) if enc else flops_per_sample(L, C, Fd, T, V)) * B
    print(f"bench_gpu_torch: {args.model} on {torch.cuda.get_device_name()}, {mode}, B {B} T {T}: "
          f"{B * T / ms * 1e3:.0f} tokens/s, step {ms:.1f} ms, {fl / ms / 1e9:.1f} TFLOP/s, "
          f"MFU {100 * fl / (ms * 1e-3) / peak:.1f}% of {peak / 1e12:.0f}; loss {loss.item():.3f} "
          f"(warm-up {warm:.0f} s; torch {torch.__version__}{note})", flush=True)
    del model, step_model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--modes", default="eager-bf16,eager-fp32,compile-bf16")
    args = ap.parse_args()
    for mode in args.modes.split(","):
        try:
            run(mode, args, SHAPES[args.model])
        except Exception as e:  # one mode failing (compile, memory) leaves the others
            print(f"bench_gpu_torch: {args.model} {mode}: failed: {type(e).__name__}: {e}", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
