#!/usr/bin/env python3
"""Golden outputs of the default decoder, SmolLM2-135M-Instruct Q4_1 GGUF, as Hugging Face
transformers computes them: the GGUF dequantised to fp32, eager attention, one prompt at a time.

    python3 scripts/make_smollm2_fixtures.py [--gguf PATH] [--gguf-wheel WHEEL] [--out DIR]
    python3 scripts/make_smollm2_fixtures.py --tokenize-only [--gguf PATH] [--out DIR]

Needs torch, transformers, tokenizers, safetensors, numpy and the `gguf` package (transformers
reads GGUF files with it). Where `gguf` is not installed, --gguf-wheel names a gguf-*.whl file
(pure Python) or an unpacked copy of one; it is put on the import path for this run only.
Not needed: network, sentencepiece, accelerate (transformers 5 wants accelerate for
from_pretrained(gguf_file=...); without it the model is built from its GGUF config and filled by
transformers' own GGUF reader, load_gguf_checkpoint, which is what from_pretrained calls).
--tokenize-only needs no torch: it checks the GGUF metadata, tokenizes the prompts and writes
prompts.txt only.

The GGUF file: --gguf, else $NOPAD_SMOLLM2_GGUF, else the path scripts/fetch_default_decoder.sh
prints (it fetches the file once into ~/.cache/nopad).

Writes into tests/data/smollm2/ (--out):
    prompts.txt          the 8 prompts in packed order, UTF-8, one per line, LF; a line break
                         inside a prompt is written as the two characters backslash and n (no
                         prompt holds a backslash, a tab or a CR, so this is the only escape)
    golden.safetensors   metadata: generator, gguf (file name), gguf_sha256, versions
        input_ids      int32   [T]       each prompt tokenized by AutoTokenizer.from_pretrained(
                                         folder, gguf_file=name) with its defaults (special tokens
                                         added as that tokenizer adds them), concatenated
        cu_seqlens     int32   [B+1]     B = 8
        last_logits    float32 [B, V]    V = 49152: logits at the last position of each prompt,
                                         the prompt run alone (batch 1, no padding, fp32, eager)
        greedy         int32   [B, 64]   generate(do_sample=False, max_new_tokens=64, EOS
                                         disabled): the 64 new ids of each prompt
        greedy_margin  float32 [B, 64]   per greedy step, from one teacher-forced run over
                                         prompt + greedy ids: the generated id's logit minus the
                                         largest other logit (top-1 minus top-2 where they agree;
                                         slightly negative at a near tie that generate's cached
                                         run broke the other way). An engine's greedy ids can be
                                         compared up to the first step whose margin is below its
                                         own error.

Checked (fails loudly otherwise): the GGUF metadata the engine relies on is present; the chat
prompt is exactly the GGUF chat template applied to its message; the one-token prompt is one id and
the long one about 200; every prompt decodes back to its text; a teacher-forced run over prompt +
greedy gives the greedy ids as its argmax at every step (up to ties within 2e-3) and the prompt's
last logits again (atol 5e-3). With accelerate installed the model is from_pretrained's, and the
script reports whether load_gguf_checkpoint alone gives the same weights.
"""

import argparse
import atexit
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
import warnings
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(REPO, "tests", "data", "smollm2")
N_NEW = 64
TIE = 2e-3  # a teacher-forced logit this far below the step's maximum is float noise, not an error

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CHAT_QUESTION = "What is the capital of France?"

LONG_TEXT = (
    "The history of the printing press begins long before Johannes Gutenberg. Woodblock printing "
    "was used in China as early as the seventh century, and movable type made of baked clay was "
    "described by the scholar Shen Kuo in the eleventh century. In Korea, metal type was cast in "
    "the thirteenth century, and the oldest surviving book printed with it dates from 1377. What "
    "Gutenberg added around 1440 was a complete system: a hand mould for casting letters quickly "
    "and precisely, an oil-based ink that stuck to metal, and a press adapted from the screw "
    "presses that wine makers used. The combination made printing cheap enough to change the "
    "world. Within fifty years, presses were running in more than two hundred cities across "
    "Europe, and millions of books had been printed. Scholars could compare identical copies of a "
    "text, errors could be corrected in the next edition, and ideas travelled faster than ever "
    "before. Historians still argue about which of these effects mattered most, but"
)

# (what, text) in packed order; the chat prompt is checked against the GGUF's chat template.
PROMPTS = [
    ("chat, default system", "<|im_start|>system\n" + SYSTEM + "<|im_end|>\n<|im_start|>user\n"
     + CHAT_QUESTION + "<|im_end|>\n<|im_start|>assistant\n"),
    ("one token", "Hello"),
    ("about 200 tokens", LONG_TEXT),
    ("repetition", "The quick brown fox jumps over the lazy dog. The quick brown fox"),
    ("chat, user only", "<|im_start|>user\nWrite a short poem about the sea.<|im_end|>\n"
     "<|im_start|>assistant\n"),
    ("code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    ("French, accents", "Bonjour ! Comment ça va ? Je m'appelle Élodie et"),
    ("question", "Q: What is 12 times 7?\nA:"),
]

# GGUF keys the C loader reads for this model (checked present; the values are printed).
REQUIRED_KEYS = [
    "general.architecture", "llama.block_count", "llama.context_length", "llama.embedding_length",
    "llama.feed_forward_length", "llama.attention.head_count", "llama.attention.head_count_kv",
    "llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon", "llama.rope.dimension_count",
    "llama.vocab_size", "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", "tokenizer.chat_template",
]


def die(msg):
    sys.exit("make_smollm2_fixtures: error: " + msg)


# ---- the gguf package ---------------------------------------------------------------------------

def use_gguf_wheel(path):
    """Put a gguf wheel (or an unpacked one) first on sys.path, before transformers is imported.
    transformers looks the package up by its metadata, so the wheel is unpacked, not zip-imported.
    """
    if os.path.isdir(path):
        root = path
    else:
        if not zipfile.is_zipfile(path):
            die("--gguf-wheel %s: not a wheel (zip) file or folder" % path)
        root = tempfile.mkdtemp(prefix="gguf_wheel.")
        atexit.register(shutil.rmtree, root, True)
        with zipfile.ZipFile(path) as z:
            z.extractall(root)
    if not os.path.isfile(os.path.join(root, "gguf", "__init__.py")):
        die("--gguf-wheel %s holds no gguf/__init__.py" % path)
    sys.path.insert(0, root)


def require_gguf():
    try:
        import gguf  # noqa: F401  (fails here, with a clear message, rather than in transformers)
        from importlib.metadata import version
        v = version("gguf")
    except ImportError as e:
        die("the `gguf` Python package is needed to read the GGUF file (%s). Install it with "
            "`pip install gguf`, or pass --gguf-wheel PATH to a gguf-*.whl file "
            "(pip download gguf --no-deps)" % e)
    except Exception as e:  # imported, but without metadata: transformers would not see it
        die("`gguf` imports but has no package metadata (%s); transformers checks its version "
            "through the metadata: install it, or pass --gguf-wheel" % e)
    parts = tuple(int(p) for p in v.split(".")[:2] if p.isdigit())
    if parts < (0, 10):
        die("gguf %s is too old: transformers needs gguf >= 0.10.0" % v)
    return v


# ---- the GGUF file ------------------------------------------------------------------------------

def find_gguf(arg):
    path = arg or os.environ.get("NOPAD_SMOLLM2_GGUF")
    if not path:
        script = os.path.join(HERE, "fetch_default_decoder.sh")
        r = subprocess.run(["bash", script], stdout=subprocess.PIPE, text=True)
        if r.returncode != 0:
            die("scripts/fetch_default_decoder.sh failed (exit %d); pass --gguf PATH"
                % r.returncode)
        path = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    if not path or not os.path.isfile(path):
        die("no GGUF file at %r; pass --gguf PATH or set NOPAD_SMOLLM2_GGUF" % path)
    return os.path.abspath(path)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def check_gguf(path):
    """The metadata and tensors the engine relies on; returns the metadata values printed."""
    from gguf import GGUFReader

    r = GGUFReader(path)
    missing = [k for k in REQUIRED_KEYS if k not in r.fields]
    if missing:
        die("%s lacks GGUF keys %s" % (path, missing))
    meta = {}
    for k in REQUIRED_KEYS:
        f = r.fields[k]
        meta[k] = len(f.data) if k in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                                       "tokenizer.ggml.merges") else f.contents()
    for k in ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
              "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id"):
        if k in r.fields:
            meta[k] = r.fields[k].contents()
    if meta["general.architecture"] != "llama":
        die("%s: general.architecture %r, expected 'llama'" % (path, meta["general.architecture"]))
    names = {t.name: t for t in r.tensors}
    n_layers = meta["llama.block_count"]
    want = ["token_embd.weight", "output_norm.weight"] + [
        "blk.%d.%s.weight" % (i, s) for i in range(n_layers) for s in (
            "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
            "ffn_up", "ffn_down")]
    absent = [n for n in want if n not in names]
    if absent:
        die("%s lacks tensors %s" % (path, absent[:5]))
    meta["tensors"] = len(r.tensors)
    meta["output.weight"] = "output.weight" in names  # absent: the head is tied to token_embd
    kinds = {}
    for t in r.tensors:
        kinds[t.tensor_type.name] = kinds.get(t.tensor_type.name, 0) + 1
    meta["tensor types"] = kinds
    return meta


# ---- transformers -------------------------------------------------------------------------------

def import_transformers(stand_in_torch):
    """transformers; with stand_in_torch (no torch installed), its GGUF metadata reader is told
    torch is there: with return_tensors=False it reads metadata only and never touches torch
    (the trick of scripts/make_gguf_tokenizer_fixtures.py)."""
    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if stand_in_torch:
        stand_in = types.ModuleType("torch")
        stand_in.__getattr__ = lambda name: object
        sys.modules["torch"] = stand_in
        try:
            try:
                import transformers.integrations.gguf.reader  # noqa: F401  (binds the stand-in)
            except ImportError:
                pass
        finally:
            del sys.modules["torch"]
        import transformers.modeling_gguf_pytorch_utils as mg

        mg.is_torch_available = lambda: True
    return transformers


def tokenize(transformers, path):
    folder, name = os.path.split(path)
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    for what, text in PROMPTS:
        if "\\" in text or "\t" in text or "\r" in text:
            die("prompt %r holds a backslash, tab or CR: prompts.txt could not round-trip it"
                % what)
    try:
        chat = tok.apply_chat_template([{"role": "user", "content": CHAT_QUESTION}],
                                       tokenize=False, add_generation_prompt=True)
    except ImportError as e:  # jinja2 is an optional dependency of transformers
        print("    chat template not applied (%s): the chat prompt is used as written" % e)
        chat = PROMPTS[0][1]
    if chat != PROMPTS[0][1]:
        die("the chat prompt differs from the GGUF chat template's text:\n%r\n%r"
            % (chat, PROMPTS[0][1]))
    ids = [tok(text)["input_ids"] for _, text in PROMPTS]
    n = {what: len(i) for (what, _), i in zip(PROMPTS, ids)}
    if n["one token"] != 1:
        die("the one-token prompt is %d ids" % n["one token"])
    if not 180 <= n["about 200 tokens"] <= 230:
        die("the long prompt is %d ids, wanted about 200" % n["about 200 tokens"])
    for (what, text), i in zip(PROMPTS, ids):
        if tok.decode(i) != text:
            die("decode(encode(%r)) does not give the text back" % what)
    return tok, ids


def write_prompts(out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "prompts.txt"), "w", encoding="utf-8", newline="\n") as f:
        for _, text in PROMPTS:
            f.write(text.replace("\n", "\\n") + "\n")
    with open(os.path.join(out, "prompts.txt"), encoding="utf-8", newline="\n") as f:
        back = [line[:-1].replace("\\n", "\n") for line in f]
    assert back == [t for _, t in PROMPTS]


def greedy_margin(steps, chosen):
    """[n] the chosen id's logit minus the largest other logit, per step of a teacher-forced run
    ([n, V] logits): the top-1 minus top-2 gap where the chosen id is the argmax, negative
    where another id scores higher (a near tie that fell the other way in generate)."""
    picked = steps.gather(1, chosen[:, None])[:, 0]
    others = steps.scatter(1, chosen[:, None], float("-inf"))
    return picked - others.max(dim=1).values


def load_model(transformers, torch, path):
    """fp32, eager. from_pretrained(gguf_file=...) where accelerate is installed; else (and, where
    it is, compared with it) the model built from the GGUF config and filled by
    load_gguf_checkpoint, which from_pretrained calls for a llama GGUF: gguf's numpy
    dequantisation, then LlamaTensorProcessor's reverse permutation of attn_q / attn_k."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.utils import is_accelerate_available

    folder, name = os.path.split(path)
    config = transformers.AutoConfig.from_pretrained(folder, gguf_file=name)
    direct = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                           dtype=torch.float32)
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=direct,
                                   torch_dtype=torch.float32)["tensors"]
    missing, unexpected = direct.load_state_dict(tensors, strict=False)
    tied = bool(getattr(direct.config, "tie_word_embeddings", False))
    if unexpected or set(missing) - ({"lm_head.weight"} if tied else set()):
        die("GGUF tensors do not fill the model: missing %s, unexpected %s" % (missing, unexpected))
    direct.tie_weights()
    direct.eval()
    how = "load_gguf_checkpoint (accelerate is not installed)"
    model = direct
    if is_accelerate_available():
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32, attn_implementation="eager")
        model.eval()
        a, b = model.state_dict(), direct.state_dict()
        differ = sorted(set(a) ^ set(b)) + [k for k in sorted(set(a) & set(b))
                                             if not torch.equal(a[k], b[k])]
        if differ:  # from_pretrained is the reference; the other path is only a stand-in for it
            print("WARNING: load_gguf_checkpoint's weights differ from from_pretrained's at %s; "
                  "the goldens use from_pretrained" % differ[:6])
            how = "from_pretrained(gguf_file=...), NOT equal to load_gguf_checkpoint"
        else:
            how = "from_pretrained(gguf_file=...), equal to load_gguf_checkpoint"
        del direct
    if model.config._attn_implementation != "eager":
        die("attention is %r, not eager" % model.config._attn_implementation)
    if any(p.dtype != torch.float32 for p in model.parameters()):
        die("the model is not fp32")
    return model, how


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", help="SmolLM2-135M-Instruct.Q4_1.gguf (default: $NOPAD_SMOLLM2_GGUF, "
                    "else what scripts/fetch_default_decoder.sh prints)")
    ap.add_argument("--gguf-wheel", help="a gguf-*.whl (or its unpacked folder) to use when the "
                    "gguf package is not installed")
    ap.add_argument("--out", default=DEFAULT_OUT, help="output folder (default tests/data/smollm2)")
    ap.add_argument("--tokenize-only", action="store_true",
                    help="no torch: check the GGUF, tokenize the prompts, write prompts.txt only")
    args = ap.parse_args()

    if args.gguf_wheel:
        use_gguf_wheel(args.gguf_wheel)
    gguf_version = require_gguf()
    path = find_gguf(args.gguf)
    meta = check_gguf(path)
    digest = sha256(path)
    print("GGUF %s (sha256 %s, gguf %s)" % (path, digest, gguf_version))
    for k, v in meta.items():
        if k != "tokenizer.chat_template":
            print("    %-40s %s" % (k, v))

    try:
        import torch
    except ImportError:
        torch = None
    if torch is None and not args.tokenize_only:
        die("torch is needed for the goldens; --tokenize-only works without it")
    transformers = import_transformers(stand_in_torch=torch is None)
    tok, ids = tokenize(transformers, path)
    write_prompts(args.out)
    for (what, text), i in zip(PROMPTS, ids):
        print("    %-22s %3d ids  %s%s" % (what, len(i), i[:8], " ..." if len(i) > 8 else ""))
    if args.tokenize_only:
        print("wrote %s (tokenize only)" % os.path.join(args.out, "prompts.txt"))
        return

    import numpy as np
    import safetensors
    import tokenizers
    from safetensors.numpy import save_file

    torch.set_num_threads(1)
    model, how = load_model(transformers, torch, path)
    cfg = model.config
    V = cfg.vocab_size
    print("model: %s via %s; hidden %d, layers %d, heads %d, kv heads %d, head %d, ffn %d, "
          "vocab %d, rope %s, rms eps %g, tied %s" % (
              type(model).__name__, how, cfg.hidden_size, cfg.num_hidden_layers,
              cfg.num_attention_heads, cfg.num_key_value_heads,
              getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads),
              cfg.intermediate_size, V, getattr(cfg, "rope_parameters", None), cfg.rms_norm_eps,
              cfg.tie_word_embeddings))

    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    model.generation_config.eos_token_id = None
    last, greedy, margins = [], [], []
    with torch.no_grad():
        for (what, _), i in zip(PROMPTS, ids):
            x = torch.tensor([i], dtype=torch.long)
            ones = torch.ones_like(x)
            lg = model(input_ids=x, attention_mask=ones).logits[0].float()
            if not torch.isfinite(lg).all():
                die("non-finite logits for %r" % what)
            last.append(lg[-1].numpy().copy())
            out = model.generate(input_ids=x, attention_mask=ones, do_sample=False,
                                 max_new_tokens=N_NEW, eos_token_id=None, pad_token_id=pad)
            new = out[0, len(i):]
            if new.numel() != N_NEW:
                die("%r: generate gave %d new ids, not %d" % (what, new.numel(), N_NEW))
            full = torch.cat([x[0], new])[None]
            tf = model(input_ids=full, attention_mask=torch.ones_like(full)).logits[0].float()
            steps = tf[len(i) - 1: len(i) - 1 + N_NEW]
            margin = greedy_margin(steps, new)
            worst = int(margin.argmin())
            if float(margin[worst]) < -TIE:
                die("%r: teacher-forced argmax differs from generate at step %d: %d there, %d "
                    "generated, logits %.5f vs %.5f" % (
                        what, worst, int(steps[worst].argmax()), int(new[worst]),
                        float(steps[worst].max()), float(steps[worst, new[worst]])))
            if not torch.allclose(tf[len(i) - 1], lg[-1], rtol=0, atol=5e-3):
                die("%r: the prompt's last logits differ in the longer run by %g" % (
                    what, float((tf[len(i) - 1] - lg[-1]).abs().max())))
            margins.append(margin.numpy().copy())
            greedy.append(new.numpy().astype(np.int32))
            print("    %-22s greedy %s  min margin %.4f  %r" % (
                what, new[:8].tolist(), float(margin.min()), tok.decode(new.tolist())[:60]))

    cu = np.zeros(len(ids) + 1, dtype=np.int32)
    cu[1:] = np.cumsum([len(i) for i in ids])
    golden = {
        "input_ids": np.concatenate([np.asarray(i, dtype=np.int32) for i in ids]),
        "cu_seqlens": cu,
        "last_logits": np.stack(last).astype(np.float32),
        "greedy": np.stack(greedy).astype(np.int32),
        "greedy_margin": np.stack(margins).astype(np.float32),
    }
    assert golden["last_logits"].shape == (len(PROMPTS), V)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__,
                "numpy": np.__version__, "gguf": gguf_version,
                "python": sys.version.split()[0]}
    out = os.path.join(args.out, "golden.safetensors")
    save_file(golden, out, metadata={
        "generator": "scripts/make_smollm2_fixtures.py", "gguf": os.path.basename(path),
        "gguf_sha256": digest, "versions": json.dumps(versions, sort_keys=True)})
    size = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    if size >= 3 * 1024 * 1024:
        die("%s holds %d bytes, over 3 MiB" % (args.out, size))
    print("wrote %s: T = %d, B = %d, V = %d, %d bytes in the folder; %s" % (
        out, int(cu[-1]), len(ids), V, size, versions))


if __name__ == "__main__":
    main()
