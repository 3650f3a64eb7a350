#!/usr/bin/env python3
"""Fixtures for padding-free training (issue 24): one training step of a tiny BERT in PyTorch.

Writes tests/data/train/:
  bert_mlm/   BertForMaskedLM saved by save_pretrained (tied decoder)
  bert_cls/   BertForSequenceClassification, 3 labels, the same encoder weights plus a pooler
  bert_reg/   BertForSequenceClassification, 1 label (regression, MSE), the same encoder and pooler
  mlm_step.safetensors   the packed batch, MLM positions and labels, the loss, every parameter's
                         gradient (grad.<name>), the parameters after two AdamW steps
                         (adamw.<name>) and after two LAMB steps (lamb.<name>)
  cls_step.safetensors, reg_step.safetensors   the batch, labels, loss and every gradient

The model: hidden 32, 2 layers, 4 heads (head size 8), intermediate 64, vocab 64, 32 positions,
2 token types, exact-erf GELU, dropout 0. Every parameter gets p += 0.1 * randn after HF's init so
LayerNorm weights are not 1 and biases not 0. The batch is 4 sequences of lengths 9, 1, 17, 12
(packed in that order, unsorted); HF runs it right-padded with an attention mask.

The reference runs in float64 (model.double()): the C side computes in float32, so the fixture's
own rounding is negligible against the tolerances of tests/test_train_cpu.c (loss 1e-5 relative,
gradients 1e-4 row-relative). The script checks that an fp32 run of HF agrees with the fp64 one to
within those tolerances too, so the fixture describes what HF fp32 computes.

Optimisers (hyperparameters in OPT below, also in the file's metadata and in the C test):
  AdamW: torch.optim.AdamW, two parameter groups: weight decay on every weight matrix and
         embedding table, none on biases and LayerNorm weights.
  LAMB:  NVIDIA apex FusedLAMB as the MLPerf BERT reference uses it (adam_w_mode, bias correction,
         grad averaging, use_nvlamb off), written out below in torch because apex needs CUDA:
         global gradient norm over every parameter, gradients divided by norm / max_grad_norm when
         the norm exceeds max_grad_norm, Adam moments, update = m^/(sqrt(v^) + eps) + wd * p,
         trust ratio ||p|| / ||update|| on tensors with weight decay (1 if either norm is 0, and 1
         on tensors without decay), p -= lr * ratio * update.
  Each runs two steps from the saved weights: step 1 with the gradients of the batch, step 2 with
  those gradients times -2 (a second step exercises the moments' history and, with a different
  gradient norm, the clipping). Both start from fresh optimiser state.

Usage: python3 scripts/make_train_fixtures.py [--out tests/data/train]   (about 6 s on CPU)
"""

from __future__ import annotations

import argparse
import json
import os
import warnings

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOISE = 0.1
LENGTHS = [9, 1, 17, 12]
MASK_ID = 3
OPT = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01, max_grad_norm=1.0,
           step2_grad_scale=-2.0)


def config() -> transformers.BertConfig:
    return transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32, type_vocab_size=2, hidden_act="gelu",
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12,
        pad_token_id=0, attn_implementation="eager")


def add_noise(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(NOISE * torch.randn(p.shape, generator=g, dtype=torch.float32))


def no_decay(name: str) -> bool:
    """Biases and LayerNorm parameters take no weight decay (BERT's recipe, MLPerf's too)."""
    return name.endswith(".bias") or "LayerNorm" in name


def padded(ids: np.ndarray, types: np.ndarray, cu: np.ndarray):
    B, S = len(cu) - 1, max(np.diff(cu))
    input_ids = torch.zeros(B, S, dtype=torch.long)
    token_types = torch.zeros(B, S, dtype=torch.long)
    mask = torch.zeros(B, S, dtype=torch.long)
    for b in range(B):
        n = cu[b + 1] - cu[b]
        input_ids[b, :n] = torch.from_numpy(ids[cu[b]:cu[b + 1]].astype(np.int64))
        token_types[b, :n] = torch.from_numpy(types[cu[b]:cu[b + 1]].astype(np.int64))
        mask[b, :n] = 1
    return input_ids, token_types, mask


def grads_of(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def adamw_steps(model, grads: dict, scales) -> dict:
    params = {n: p.detach().clone().double().requires_grad_(True) for n, p in model.named_parameters()}
    groups = [
        {"params": [p for n, p in params.items() if not no_decay(n)], "weight_decay": OPT["weight_decay"]},
        {"params": [p for n, p in params.items() if no_decay(n)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=OPT["lr"], betas=(OPT["beta1"], OPT["beta2"]), eps=OPT["eps"])
    for s in scales:
        for n, p in params.items():
            p.grad = grads[n].double() * s
        opt.step()
    return {n: p.detach() for n, p in params.items()}


def lamb_steps(model, grads: dict, scales) -> tuple[dict, list]:
    """apex FusedLAMB (adam_w_mode=True, bias_correction=True, grad_averaging=True,
    use_nvlamb=False), in float64."""
    b1, b2, eps, lr = OPT["beta1"], OPT["beta2"], OPT["eps"], OPT["lr"]
    params = {n: p.detach().clone().double() for n, p in model.named_parameters()}
    m = {n: torch.zeros_like(p) for n, p in params.items()}
    v = {n: torch.zeros_like(p) for n, p in params.items()}
    norms = []
    for step, s in enumerate(scales, start=1):
        g_all = {n: grads[n].double() * s for n in params}
        global_norm = torch.sqrt(sum((g * g).sum() for g in g_all.values()))
        norms.append(float(global_norm))
        clip = global_norm / OPT["max_grad_norm"] if global_norm > OPT["max_grad_norm"] else 1.0
        bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
        for n, p in params.items():
            wd = 0.0 if no_decay(n) else OPT["weight_decay"]
            g = g_all[n] / clip
            m[n] = b1 * m[n] + (1 - b1) * g
            v[n] = b2 * v[n] + (1 - b2) * g * g
            update = (m[n] / bc1) / (torch.sqrt(v[n] / bc2) + eps) + wd * p
            ratio = 1.0
            if wd != 0.0:
                p_norm, u_norm = p.norm(), update.norm()
                if p_norm != 0 and u_norm != 0:
                    ratio = float(p_norm / u_norm)
            params[n] = p - lr * ratio * update
    return params, norms


def f32(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).contiguous().numpy()


def check_fp32_agrees(model64, run, loss64: torch.Tensor, grads64: dict, what: str) -> None:
    """HF in float32 must agree with the float64 reference within the C test's tolerances."""
    model32 = type(model64)(model64.config)
    model32.load_state_dict({k: v.float() for k, v in model64.state_dict().items()})
    model32.zero_grad()
    loss32 = run(model32)
    loss32.backward()
    rel = abs(float(loss32) - float(loss64)) / abs(float(loss64))
    assert rel < 1e-5, f"{what}: fp32 loss differs from fp64 by {rel:.2e}"
    for n, p in model32.named_parameters():
        a, b = p.grad.double(), grads64[n]
        if n.endswith("key.bias"):
            # Exactly zero in exact arithmetic (a key bias adds q.b to every score of a row, which
            # softmax ignores): both sides hold rounding noise, so compare against the scale of
            # the value bias's gradient instead.
            scale = grads64[n.replace("key.bias", "value.bias")].norm()
            assert a.norm() < 1e-4 * scale and b.norm() < 1e-4 * scale, f"{what}: {n} not ~0"
            continue
        a2, b2 = a.reshape(a.shape[0], -1) if a.dim() > 1 else a[None], b.reshape(b.shape[0], -1) if b.dim() > 1 else b[None]
        err = ((a2 - b2).norm(dim=1) / b2.norm(dim=1).clamp_min(1e-6)).max()
        assert err < 1e-4, f"{what}: fp32 gradient of {n} differs from fp64 by {err:.2e}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "data", "train"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(24)
    rng = np.random.default_rng(24)

    cfg = config()
    mlm = transformers.BertForMaskedLM(cfg)
    add_noise(mlm, 1)
    assert mlm.cls.predictions.decoder.weight.data_ptr() == mlm.bert.embeddings.word_embeddings.weight.data_ptr()

    # The packed batch: ids avoid the pad id so nothing is special about any token.
    cu = np.concatenate([[0], np.cumsum(LENGTHS)]).astype(np.int32)
    T = int(cu[-1])
    ids = rng.integers(4, cfg.vocab_size, size=T).astype(np.int32)
    types = np.zeros(T, dtype=np.int32)
    for b in range(len(LENGTHS)):  # the second segment of each sequence is type 1
        n = LENGTHS[b]
        types[cu[b] + (n + 1) // 2:cu[b + 1]] = 1
    # MLM positions: about 25% of each sequence, at least one (the length-1 sequence included).
    positions = []
    for b, n in enumerate(LENGTHS):
        k = max(1, round(0.25 * n))
        positions += sorted((cu[b] + rng.choice(n, size=k, replace=False)).tolist())
    positions = np.array(positions, dtype=np.int32)
    mlm_labels = rng.integers(0, cfg.vocab_size, size=len(positions)).astype(np.int32)
    ids[positions] = MASK_ID

    input_ids, token_types, mask = padded(ids, types, cu)
    S = input_ids.shape[1]
    labels = torch.full(input_ids.shape, -100, dtype=torch.long)
    for p, lab in zip(positions, mlm_labels):
        b = int(np.searchsorted(cu, p, side="right") - 1)
        labels[b, p - cu[b]] = int(lab)

    def run_mlm(model):
        return model(input_ids=input_ids, token_type_ids=token_types, attention_mask=mask,
                     labels=labels).loss

    mlm.save_pretrained(os.path.join(args.out, "bert_mlm"))
    mlm64 = mlm.double()
    mlm64.zero_grad()
    loss = run_mlm(mlm64)
    loss.backward()
    grads = grads_of(mlm64)
    check_fp32_agrees(mlm64, run_mlm, loss, grads, "mlm")

    scales = [1.0, OPT["step2_grad_scale"]]
    after_adamw = adamw_steps(mlm64, grads, scales)
    after_lamb, norms = lamb_steps(mlm64, grads, scales)
    assert all(n > OPT["max_grad_norm"] for n in norms), f"clipping must be active: norms {norms}"
    out = {"input_ids": ids, "token_type_ids": types, "cu_seqlens": cu,
           "mlm_positions": positions, "mlm_labels": mlm_labels,
           "loss": np.array([float(loss)], dtype=np.float64),
           "lamb_grad_norms": np.array(norms, dtype=np.float64)}
    for n in grads:
        out["grad." + n] = f32(grads[n])
        out["adamw." + n] = f32(after_adamw[n])
        out["lamb." + n] = f32(after_lamb[n])
    meta = {"generator": "scripts/make_train_fixtures.py", "torch": torch.__version__,
            "transformers": transformers.__version__, "opt": json.dumps(OPT)}
    save_file(out, os.path.join(args.out, "mlm_step.safetensors"), metadata=meta)
    print(f"mlm: T={T} B={len(LENGTHS)} masked={len(positions)} loss={float(loss):.6f} "
          f"grad norms (LAMB steps) {norms}")

    # Sequence classification (3 labels) and regression (1 label) on the same encoder.
    for name, num_labels in (("cls", 3), ("reg", 1)):
        ccfg = config()
        ccfg.num_labels = num_labels
        model = transformers.BertForSequenceClassification(ccfg)
        add_noise(model, 2)  # pooler and classifier; the encoder is overwritten below
        model.bert.load_state_dict(mlm.bert.state_dict(), strict=False)
        model = model.float()
        model.save_pretrained(os.path.join(args.out, "bert_" + name))
        if num_labels == 1:
            targets = torch.from_numpy(rng.normal(size=len(LENGTHS)).astype(np.float32))
            model.config.problem_type = "regression"
        else:
            targets = torch.from_numpy(rng.integers(0, num_labels, size=len(LENGTHS)))
            model.config.problem_type = "single_label_classification"

        def run_cls(m, targets=targets):
            t = targets.to(torch.float64 if m.dtype == torch.float64 else torch.float32) \
                if num_labels == 1 else targets
            return m(input_ids=input_ids, token_type_ids=token_types, attention_mask=mask,
                     labels=t).loss

        m64 = model.double()
        m64.zero_grad()
        loss = run_cls(m64)
        loss.backward()
        g = grads_of(m64)
        check_fp32_agrees(m64, run_cls, loss, g, name)
        out = {"input_ids": ids, "token_type_ids": types, "cu_seqlens": cu,
               "loss": np.array([float(loss)], dtype=np.float64)}
        if num_labels == 1:
            out["targets"] = targets.numpy().astype(np.float32)
        else:
            out["labels"] = targets.numpy().astype(np.int32)
        for n in g:
            out["grad." + n] = f32(g[n])
        save_file(out, os.path.join(args.out, name + "_step.safetensors"),
                  metadata={"generator": "scripts/make_train_fixtures.py", "num_labels": str(num_labels)})
        print(f"{name}: num_labels={num_labels} loss={float(loss):.6f}")


if __name__ == "__main__":
    main()
