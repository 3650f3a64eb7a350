#!/usr/bin/env python3
"""The extra lines of the tokenizer parity corpus (tests/data/tokenizer/corpus.jsonl).

    python3 scripts/make_tokenizer_corpus.py          # rewrites corpus.jsonl (all lines)
    python3 scripts/make_tokenizer_corpus.py --print  # prints the extra lines as JSON strings

corpus.jsonl starts with the 194 lines of scripts/make_tokenizer_fixtures.py (corpus_lines();
tests/data/tokenizer/bpe_cases.jsonl indexes them, so they keep their places) and continues with
extra_lines() below: source code, URLs, numbers with separators, whitespace runs, NFC and NFD
accents, many scripts, emoji sequences, controls, NFKC-sensitive forms, 1000+ character words,
quote styles, markdown, JSON and the special-token strings of every parity tokenizer (<s>, [CLS],
<|endoftext|>, <|im_start|>, <0x41>, ▁, Ġ ...), then seeded random mixtures. Writing the file goes
through make_tokenizer_fixtures.write_corpus, so every line carries the WordPiece ids that
tests/test_tokenizer.c checks (it needs all-MiniLM-L6-v2: NOPAD_MINILM_DIR or the pip package).

The output is deterministic: fixed lists and random.Random(SEED).
"""
import argparse
import json
import os
import random
import sys
import unicodedata

SEED = 20250320

# Special-token strings of the parity tokenizers (scripts/make_tokenizer_parity.py).
SPECIALS = ["<s>", "</s>", "<unk>", "<pad>", "<mask>", "[CLS]", "[SEP]", "[MASK]", "[PAD]",
            "[UNK]", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
            "<|end_of_text|>", "<0x41>", "<0x0A>"]

CODE = [
    # C
    "int main(int argc, char **argv) {\n\tprintf(\"%d\\n\", argc);\n\treturn 0;\n}",
    "static inline uint32_t rotl(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }",
    "#include <stdio.h>\r\n#define MAX(a, b) ((a) > (b) ? (a) : (b))\r\n",
    # Python
    "class Foo(Bar):\n    def __init__(self, *args, **kwargs):\n        super().__init__(*args)\n",
    "for i, (k, v) in enumerate(sorted(d.items(), key=lambda kv: -kv[1])): print(f\"{i:>3} {k!r}\")",
    "    if x is not None and len(x) >= 10:  # indented 4\n        pass",
    # Rust
    "fn main() -> Result<(), Box<dyn Error>> { let v: Vec<u8> = vec![0xFF; 16]; Ok(()) }",
    "impl<'a, T: Clone + 'a> Iterator for Iter<'a, T> { type Item = &'a T; }",
    # JavaScript / TypeScript
    "const f = async (x) => { await fetch(`/api/${x}?q=1`); return x ?? null; };",
    "export default function App({ children }: Props): JSX.Element { return <div>{children}</div>; }",
    # Go
    "func (s *Server) Handle(w http.ResponseWriter, r *http.Request) {\n\tif err != nil {\n\t\treturn\n\t}\n}",
    # SQL
    "SELECT u.id, COUNT(*) AS n FROM users u LEFT JOIN orders o ON o.uid = u.id WHERE u.age >= 18 GROUP BY u.id;",
    # shell
    "for f in *.txt; do grep -c 'foo' \"$f\" 2>/dev/null || echo \"$f: none\"; done | sort -n",
    # HTML / XML
    "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>T&amp;C</title></head></html>",
    "<?xml version=\"1.0\"?><root xmlns:a=\"urn:x\"><a:item id='1'/></root>",
    # Haskell, LaTeX, Lisp, assembly, regex
    "main = mapM_ (putStrLn . show) $ takeWhile (< 100) [x * x | x <- [1..]]",
    "\\begin{equation} E = mc^2 \\quad \\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2} \\end{equation}",
    "(defun fact (n) (if (<= n 1) 1 (* n (fact (- n 1)))))",
    "mov rax, [rbp-0x18]\n\tadd rax, 0x1\n\tjmp .L2",
    "^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*)@$",
    # CUDA
    "__global__ void k(float *__restrict__ y, const float *x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; }",
]

WEB = [
    "https://www.example.com:8080/a/b/c.html?x=1&y=%E2%9C%93&z=a+b#frag-ment",
    "ftp://user:p%40ss@ftp.example.org/pub/file.tar.gz and file:///C:/Users/me/Desktop/x.txt",
    "http://例え.テスト/パス?クエリ=値 and https://xn--r8jz45g.xn--zckzah/",
    "https://en.wikipedia.org/wiki/Caf%C3%A9_(disambiguation) (see also https://t.co/AbC123)",
    "mailto:first.last+tag@sub.example-domain.co.jp, \"quoted name\"@example.com, üser@exämple.de",
    "Contact: <jane_doe-99@mail.example.io>; cc: ops@[192.168.1.1]",
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
    "@user_name #hash_tag $CASH r/subreddit u/someone www.example.com",
]

NUMBERS = [
    "1,000,000 1.000.000 1 000 000 1\u202f000\u202f000 1'000'000 10,00,000 (lakh)",
    "3.14e-10 6.02214076E+23 -0.000001 +42 1e9 0.5 .5 5. 1_000_000 0b1111_0000",
    "Phone: +1 (415) 555-2671, +44 20 7946 0958, +49-30-123456, 06 12 34 56 78, 555.123.4567",
    "Dates: 2024-02-29, 29/02/2024, 02/29/24, 29.02.2024, 2024年2月29日, 29 февраля 2024",
    "Times: 23:59:59.999, 11:59 PM, 0700Z, T+00:00:05, 1h30m, 90s",
    "Money: $1,234.56 €1.234,56 ¥123,456 ₹1,23,456.78 CHF 1'234.50 -$0.99",
    "Version v2.10.0-rc.1, ISBN 978-3-16-148410-0, SSN 123-45-6789, MAC 00:1A:2B:3C:4D:5E",
    "12345678901234567890123456789012345678901234567890 and 3.14159265358979323846264338327950288",
    "Ratios 16:9 4:3, scores 3-2, ranges 10–20, 1/2 ½ 3/4 ¾, 50%, 99.9‰, 2^10=1024",
    "Full-width digits １２３，４５６．７８ and Arabic-Indic ١٬٢٣٤٫٥٦ and Devanagari १,२३४",
]

WHITESPACE = [
    "a  b   c    d     e      f",
    "\t\tindented\twith\ttabs\t\t",
    "line one\nline two\n\nline four\n\n\n",
    "windows\r\nline\r\nendings\r\n\r\n",
    "old mac\rcarriage\rreturns",
    "     ",
    "\t",
    "\n\n\n",
    "\r\n",
    " leading space",
    "trailing space ",
    "  both  ",
    " \t \n \r\n mixed \u00a0\u2003\u3000 whitespace \t ",
    "x" + " " * 64 + "y",
    "▁ literal metaspace ▁▁ and ▁word and word▁",
    "Ġ literal byte-level space Ġhello Ċ newline char ĉ",
]

ACCENTS = [
    unicodedata.normalize("NFC", "café résumé naïve Ångström São Paulo Zürich Dvořák Łódź"),
    unicodedata.normalize("NFD", "café résumé naïve Ångström São Paulo Zürich Dvořák Łódź"),
    unicodedata.normalize("NFC", "Tiếng Việt có dấu: Người ở đâu? Hà Nội, Đà Nẵng"),
    unicodedata.normalize("NFD", "Tiếng Việt có dấu: Người ở đâu? Hà Nội, Đà Nẵng"),
    unicodedata.normalize("NFD", "한국어 정규화: 가나다 한글"),
    "Hangul jamo sequence \u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af and syllables 각 한글",
    "Mixed NFC/NFD: e\u0301 é \u00e9 e\u0301\u0301 \u1e17 e\u0304\u0301",
    "Combining stacks: a\u0300\u0301\u0302\u0303\u0304\u0305\u0306\u0307\u0308\u0309 q\u0323\u0324\u0325\u0326",
    "Lone combining at start \u0301abc and after space \u0308 x",
    "Ordering: a\u0323\u0301 vs a\u0301\u0323 vs \u1ea1\u0301 vs \u1ea5",
    "Hebrew points: שָׁלוֹם בְּרֵאשִׁית",
    "Arabic shadda and vowels: مُحَمَّدٌ كِتَابٌ",
    "Devanagari conjuncts: क्षत्रिय ज्ञान श्री द्व्यक्षर",
]

SCRIPTS = [
    "中文段落：自然语言处理是人工智能的一个重要方向，分词是第一步。",
    "古文：學而時習之，不亦說乎？有朋自遠方來，不亦樂乎？",
    "日本語の文章：吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。",
    "カタカナ長音ー、半角ｶﾀｶﾅｰ、ひらがな「ゐゑ」と小書き「ぁぃぅ」",
    "한국어 문장: 다람쥐 헌 쳇바퀴에 타고파. 키스의 고유조건은 입술끼리 만나야 하고",
    "Hangul compatibility jamo ㅎㅏㄴㄱㅡㄹ and halfwidth ﾾￂￃ",
    "العربية: الخط العربي جميل، وهو يُكتب من اليمين إلى اليسار. ١٢٣",
    "فارسی: سلام دنیا، من فارسی صحبت می‌کنم",
    "עברית: אבגדהוזחטיכלמנסעפצקרשת ךםןףץ",
    "हिन्दी में एक वाक्य: भारत एक विशाल देश है।",
    "ภาษาไทย: การตัดคำภาษาไทยเป็นเรื่องยากเพราะไม่มีการเว้นวรรค",
    "Русский текст: Широкая электрификация южных губерний даст мощный толчок подъёму сельского хозяйства.",
    "Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. ΑΡΧΑΊΑ ἀρχαῖα ᾅδης",
    "Georgian: ქართული ანბანი; Armenian: Բարեւ; Ethiopic: ሰላም ዓለም",
    "Tamil தமிழ் Telugu తెలుగు Kannada ಕನ್ನಡ Malayalam മലയാളം Gujarati ગુજરાતી",
    "Myanmar မြန်မာ Khmer ខ្មែរ Lao ລາວ Tibetan བོད་ཡིག Sinhala සිංහල",
    "Mixed: Hello世界Привет안녕مرحباשלוםनमस्तेสวัสดีΓειά",
]

EMOJI = [
    "Family ZWJ: 👨‍👩‍👧‍👦 👩‍👩‍👦 👨‍👨‍👧‍👧 and couple 💑 👩‍❤️‍💋‍👨",
    "Skin tones: 👍🏻👍🏼👍🏽👍🏾👍🏿 🤝🏽 🧑🏾‍🚀 👩🏻‍⚕️ 🏃🏿‍♀️",
    "Flags: 🇬🇧🇺🇸🇯🇵🇧🇷🇮🇳🇿🇦 🏴󠁧󠁢󠁳󠁣󠁴󠁿 🏳️‍⚧️ 🏴‍☠️",
    "Keycaps: 0️⃣1️⃣2️⃣3️⃣ *️⃣ #️⃣ 🔟 and bare 1\u20e3",
    "Text vs emoji presentation: ☺ ☺️ ♥ ♥️ ✔ ✔️ ⚠ ⚠️",
    "Emoji runs with no spaces:😀😁😂🤣😃😄😅😆😉😊😋😎😍😘🥰😗",
    "Hair and gender: 👩‍🦰 👨‍🦳 🧑‍🦲 🧙‍♂️ 🧜‍♀️ 🦸🏽‍♂️",
]

CONTROLS = [
    "C0: \x01\x02\x03\x04\x05\x06\x07\x08\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f end",
    "C1: \x80\x81\x82\x83\x84\x85\x86\x87\x88\x89\x8a\x8b\x8c\x8d\x8e\x8f\x90\x9f end",
    "DEL\x7fin\x7f\x7fmiddle",
    "zero width: a\u200bb\u200cc\u200dd\u2060e\ufefff\u180eg\u00adh",
    "\ufeff\ufeffdouble BOM start",
    "bidi: \u202aLRE\u202c \u202bRLE\u202c \u202dLRO\u202c \u202eRLO\u202c \u2066LRI\u2069 \u2067RLI\u2069 \u2068FSI\u2069 \u200e\u200f\u061c",
    "NUL \x00 in \x00\x00 text",
    "ANSI escape \x1b[1;31mred\x1b[0m and BEL \x07",
    "noncharacters \ufffe\uffff \U0001fffe and surrogates-as-text \\ud800",
    "vertical tab\x0bform feed\x0cfile separator\x1cunit sep\x1f",
]

NFKC = [
    "Ligatures: ﬁnance ﬂow ﬀ ﬃ ﬄ ﬅ ﬆ Ǆ ǅ ǆ Ĳ ĳ",
    "Units: ㎏ ㎞ ㎡ ㏄ ℃ ℉ № ℡ ™ ㍻ ㋿",
    "Circled and parenthesized: ① ⑳ ㉑ ㊿ ⑴ ⒜ Ⓐ ⓩ ❶ ➊",
    "Roman: Ⅰ Ⅱ Ⅻ ⅿ ⅰⅱⅲ Ⅼ Ⅽ Ⅾ Ⅿ",
    "Fullwidth: ＨＥＬＬＯ　ｗｏｒｌｄ！＂＃＄％＆＇（）＊＋，－．／：；＜＝＞？＠［＼］＾＿｀｛｜｝～",
    "Halfwidth katakana with dakuten: ｶﾞｷﾞｸﾞ ﾊﾟﾋﾟ and fullwidth ガギグ パピ",
    "Superscripts/subscripts: x⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿ y₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎",
    "Fractions: ¼ ½ ¾ ⅐ ⅑ ⅒ ⅓ ⅔ ⅕ ⅛ ⅞ ↉",
    "Math alphanumerics: 𝐇𝐞𝐥𝐥𝐨 𝑾𝒐𝒓𝒍𝒅 𝔉𝔯𝔞𝔨𝔱𝔲𝔯 𝕯𝖔𝖚𝖇𝖑𝖊 𝟘𝟙𝟚",
    "Compatibility: ſ µ ﹏ ︴ ﹐ ﹑ ﹒ ︰ ｟ ｠ ＿ ﾠ ㄱ ㉠ ㈀",
    "Angstrom sign \u212b vs Å vs A\u030a; Ohm \u2126 vs Ω; Kelvin \u212a vs K",
    "Arabic presentation forms: ﷺ ﷽ ﻻ ﻷ ﺍﻟﻠﻪ",
    "CJK compatibility ideographs: 豈 更 車 賈 滑 串 句 龜 and ㋀ ㍐ ㏠",
]

QUOTES = [
    "``double backticks'' and ''two apostrophes'' as LaTeX quotes",
    "“smart double” ‘smart single’ „low-9“ ‚low single‘ «guillemets» ‹single› 「corner」 『white』",
    "He said, \"It's the cat's toy,\" and she replied, 'Don't!' — then ``really''?",
    "Apostrophes: it's it’s it ʼs it‘s didn't didn’t y'all'd've O'Neil's rock 'n' roll",
    "Primes: 5′ 10″ 3‴ and ditto 〃 and backtick `code` and ´acute",
]

MARKUP = [
    "# Title\n\n## Subtitle\n\n- item *one*\n- item **two**\n  - nested `code`\n\n1. first\n2. second",
    "> quote with [a link](https://example.com \"title\") and ![img](a.png)\n\n---\n\n| a | b |\n|---|:-:|\n| 1 | 2 |",
    "```python\nprint('fenced')\n```\n\n~~strike~~ __bold__ _it_ <kbd>Ctrl</kbd>+<kbd>C</kbd>",
    '{"name": "nopad", "version": 2, "tags": ["a", "b"], "nested": {"x": null, "y": true, "z": -1.5e3}}',
    '[{"id":1,"text":"caf\\u00e9 \\ud83d\\ude00","ok":false},{"id":2,"text":"line\\nbreak\\ttab"}]',
    "key: value\nlist:\n  - a: 1\n    b: [x, y]\n# yaml comment\nmultiline: |\n  text",
    "name,age,city\n\"Doe, Jane\",34,\"New York\"\n\"O'Brien\",,Dublin\n",
    "[section]\nkey = \"value\" # toml\narray = [1, 2, 3]\n[[table]]\nx = 1979-05-27T07:32:00Z",
]

SPECIAL_LINES = [
    "<s>",
    "</s>",
    "<s></s>",
    "<s> hello </s>",
    "<s>hello</s>",
    " <s>x</s> ",
    "<unk> <unk><unk> x<unk>y",
    "<pad><pad> text <pad>",
    "Fill <mask> here, <mask>there, and<mask> there <mask>.",
    "<mask>",
    " <mask> ",
    "[CLS] sentence one [SEP] sentence two [SEP]",
    "[CLS][MASK][SEP][PAD][UNK]",
    "<|endoftext|>",
    "text<|endoftext|>more text <|endoftext|> end",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|>Hello<|end_of_text|>",
    "<|begin_of_text|> <|begin_of_text|><|begin_of_text|>",
    "byte tokens as text: <0x41> <0x0A><0xFF> <0x>",
    "near misses: <s > < s> <S> <|endoftext| > <|IM_START|> [cls] [ CLS] <mask >",
    "nested: <<s>> [[CLS]] <|<|endoftext|>|> </s></s></s>",
]


def long_words():
    """Three words of 1000+ characters: ASCII, accented Latin and CJK, and a mixed run."""
    ascii_word = "".join("abcdefghijklmnopqrstuvwxyz"[(i * 7) % 26] for i in range(1200))
    rng = random.Random(SEED + 1)
    latin = "".join(rng.choice("aeiouéèêëàâäôöûüçñß") for _ in range(1100))
    mixed = "".join(rng.choice(["ab", "漢", "字", "é", "x1", "–", "ж", "😀"]) for _ in range(700))
    return [ascii_word, latin, "prefix " + mixed + " suffix"]


RANDOM_POOL = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" + " " * 12 + "\t\n\r"
    + ".,;:!?'\"-()[]{}<>/\\@#$%^&*+=|~`_" + "éèêëàâäôöûüçñßÅåØøİıŞşĞğ" + "e\u0301a\u0308"
    + "αβγδΣσςΩ" + "абвгдЖЗИЙ" + "مرحبا" + "שלום" + "नमस्ते" + "สวัสดี" + "你好世界漢字"
    + "こんにちはカタカナ" + "안녕하세요각" + "😀👍🏽🇺🇸\u200d❤️⃣" + "\u0301\u0308\u200b\u00ad\ufeff\u202e\x7f\x85"
    + "①ⅰ²ＡＢ１ﬁ㎏…—“”«»▁Ġ"
)


def random_lines(n):
    rng = random.Random(SEED)
    out = []
    for _ in range(n):
        length = rng.randint(1, 80)
        parts = []
        while len(parts) < length:
            r = rng.random()
            if r < 0.04:
                parts.append(rng.choice(SPECIALS))
            elif r < 0.25:
                parts.append(rng.choice(["the", "token", "izer", "hello", "world", "ing", "Über",
                                         "日本", "данные", "123", "  ", "'s", "n't"]))
            else:
                parts.append(rng.choice(RANDOM_POOL))
        out.append("".join(parts))
    return out


def extra_lines():
    return (CODE + WEB + NUMBERS + WHITESPACE + ACCENTS + SCRIPTS + EMOJI + CONTROLS + NFKC + QUOTES
            + MARKUP + SPECIAL_LINES + long_words() + random_lines(40))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--print", action="store_true", help="print the extra lines and exit")
    args = ap.parse_args()
    if args.print:
        for t in extra_lines():
            print(json.dumps(t, ensure_ascii=False))
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_tokenizer_fixtures

    make_tokenizer_fixtures.write_corpus()


if __name__ == "__main__":
    main()
