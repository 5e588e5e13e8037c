"""Train Flint's GLM-4.x-style tokenizer and write it to flint_backend/tokenizer/.

Byte-level BPE with GLM-4's pre-tokenizer (the GPT-4 split regex, then ByteLevel without a
prefix space); 8192 ids: 8175 trained, then the 17 chat tags of flint_backend.tokenizer.
Corpus, in a fixed sorted order: the running interpreter's standard library (.py, tests
excluded) and scripts/tokenizer_corpus.txt. The same Python version writes the same files
(the committed ones: CPython 3.11.7).

    python scripts/build_tokenizer.py [--out flint_backend/tokenizer]
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from flint_backend.tokenizer import ADDED_TOKENS, SPECIAL_TOKENS, TAG_TOKENS, TOKENIZER_DIR, VOCAB_SIZE

# GLM-4's split (cl100k): contractions, letters with one leading non-letter, digits in groups of up to 3,
# punctuation runs, newlines, spaces (the last space before a word stays with the word).
SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SKIPPED_STDLIB_DIRS = {"test", "tests", "idlelib", "site-packages", "__pycache__"}
SAMPLE_FILE = Path(__file__).with_name("tokenizer_corpus.txt")
TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "eos_token": "<|endoftext|>",
    "pad_token": "<|endoftext|>",
    "model_max_length": 262144,
    "padding_side": "left",
    # GLM's template writes [gMASK]<sop> itself; nothing is added around encoded text
    "add_bos_token": False,
    "add_eos_token": False,
    # decode must give back the exact text (no " ." -> "." clean-up)
    "clean_up_tokenization_spaces": False,
}


def corpus_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [
        p for p in stdlib.rglob("*.py")
        if not SKIPPED_STDLIB_DIRS.intersection(p.relative_to(stdlib).parts[:-1])
    ]
    return sorted(files, key=lambda p: p.relative_to(stdlib).as_posix()) + [SAMPLE_FILE]


def train(files: list[Path]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(ADDED_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: any text encodes
        special_tokens=[],
        show_progress=False,
    )
    texts = (f.read_bytes().decode("utf-8", errors="replace") for f in files)
    tok.train_from_iterator(texts, trainer, length=len(files))
    trained = tok.get_vocab_size(with_added_tokens=False)
    if trained != VOCAB_SIZE - len(ADDED_TOKENS):
        sys.exit(f"trained vocabulary: expected {VOCAB_SIZE - len(ADDED_TOKENS)} ids, got {trained}")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    return tok


def check(tok: Tokenizer) -> None:
    first = VOCAB_SIZE - len(ADDED_TOKENS)
    for i, t in enumerate(ADDED_TOKENS):
        ids = tok.encode(f"a{t}b", add_special_tokens=False).ids
        if tok.token_to_id(t) != first + i or first + i not in ids:
            sys.exit(f"added token {t}: expected id {first + i} as one token, got {ids}")
    sample = SAMPLE_FILE.read_text(encoding="utf-8")
    if tok.decode(tok.encode(sample).ids) != sample:
        sys.exit(f"{SAMPLE_FILE.name}: decode(encode(text)) differs from the text")


def json_lines(obj, indent: str = "") -> str:
    """JSON in which scalar-only lists are inline, so a vocab entry or a merge is one line."""
    inner = indent + "  "
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {json_lines(v, inner)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        return "[\n" + ",\n".join(inner + json_lines(v, inner) for v in obj) + f"\n{indent}]"
    return json.dumps(obj, ensure_ascii=False)


def tokenizer_config(tok: Tokenizer, chat_template: str) -> dict:
    decoder = {
        str(i): {
            "content": t.content, "lstrip": t.lstrip, "normalized": t.normalized,
            "rstrip": t.rstrip, "single_word": t.single_word, "special": t.special,
        }
        for i, t in sorted(tok.get_added_tokens_decoder().items())
    }
    return {
        **TOKENIZER_CONFIG,
        # transformers 5 reads this as extra_special_tokens: all_special_ids then has all seven
        "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
        "added_tokens_decoder": decoder,
        "chat_template": chat_template,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=TOKENIZER_DIR)
    args = parser.parse_args()

    files = corpus_files()
    tok = train(files)
    check(tok)
    text = json_lines(json.loads(tok.to_str())) + "\n"
    assert Tokenizer.from_str(text).to_str() == tok.to_str()

    args.out.mkdir(parents=True, exist_ok=True)
    chat_template = (TOKENIZER_DIR / "chat_template.jinja").read_text(encoding="utf-8")
    if args.out.resolve() != TOKENIZER_DIR:
        (args.out / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
    (args.out / "tokenizer.json").write_text(text, encoding="utf-8")
    config = json.dumps(tokenizer_config(tok, chat_template), indent=2, ensure_ascii=False) + "\n"
    (args.out / "tokenizer_config.json").write_text(config, encoding="utf-8")
    print(f"{len(files)} corpus files ({sys.version.split()[0]}) -> {tok.get_vocab_size()} ids in {args.out}")


if __name__ == "__main__":
    main()
