#!/bin/sh
# cotrain tests: `cotrain-admin dataset tokenizer` end to end on a throwaway
# PostgreSQL (tests/with-pgtmp), on real text (the repository's doc/ pages):
# training is recorded and pinned, reproducible through the command line,
# refusals (bad options, too large a vocabulary, a dataset that is no text,
# invalid UTF-8, no text at all) change nothing, and the export is a
# tokenizer.json whose vocabulary is SentencePiece's own and which encodes
# doc/ as SentencePiece does (python3's sentencepiece against the
# `tokenizers` library where it is installed, else against
# tests/hf_tokenizer_reference.py).
. "$top_srcdir/tests/tap.sh"

if [ -z "$COTRAIN_DB" ]; then
	exec "$top_builddir/tests/with-pgtmp" "$SHELL" "$0" "$@"
fi
A="$top_builddir/server/cotrain-admin"
PSQL="$PG_BINDIR/psql"
[ -x "$PSQL" ] || PSQL=psql
command -v "$PSQL" >/dev/null 2>&1 || skip_all "psql not found"
PY="${SPM_PYTHON:-/usr/bin/python3}"

T=$(mktemp -d /tmp/cot-tok-XXXXXX)
trap 'rm -rf "$T"' EXIT INT TERM
chmod 755 "$T"
D="$T/data"
export COTRAIN_DATA_DIR="$D"
q() { "$PSQL" -X -A -t -q -c "$1" 2>&1; }
# what "nothing changed" compares: the rows a training writes
snapshot() {
	q "SELECT (SELECT count(*) FROM tokenizer) || ' ' || (SELECT count(*) FROM file) || ' ' ||
	          (SELECT string_agg(name || '=' || coalesce(trained_tokenizer, '-'), ',' ORDER BY name) FROM dataset)"
}
run() { "$A" "$@" >"$T/out" 2>"$T/err"; echo $? >"$T/rc"; }
rc() { cat "$T/rc"; }
err_has() { grep -q -- "$1" "$T/err"; }

run db migrate;                         is "$(rc)" 0 "db migrate"
run dataset import --heldout-fraction 0.05 docs "$top_srcdir/doc"
is "$(rc)" 0 "import doc/ as the text dataset \"docs\""

# ---- training ---------------------------------------------------------------
run dataset tokenizer train docs --type unigram --vocab 1000 --normalize nfkc,keep-accents
is "$(rc)" 0 "train a Unigram tokenizer of 1000 pieces"
diag "$(cat "$T/out" "$T/err")"
sha=$(sed -n 's/^tokenizer \([0-9a-f]\{64\}\)$/\1/p' "$T/out")
ok $([ -n "$sha" ]; echo $?) "  it prints the model's sha256 ($sha)"
is "$(q "SELECT trained_tokenizer FROM dataset WHERE name = 'docs'")" "$sha" "  recorded on the dataset"
is "$(q "SELECT type || ' ' || vocab || ' ' || normalize || ' ' || special FROM tokenizer WHERE sha256 = '$sha'")" \
   "unigram 1000 nfkc,keep-accents [CLS],[SEP],[MASK],[PAD],[UNK]" "  the tokenizer row holds its options"
is "$(q "SELECT kind FROM file WHERE sha256 = '$sha'")" "tokenizer" "  the file row is of kind tokenizer"
f="$D/files/$(echo "$sha" | cut -c1-2)/$sha"
is "$(sha256sum "$f" | cut -d' ' -f1)" "$sha" "  the model is in the store under its sha256"
grep -q "special: \[CLS\] [0-9]*, \[SEP\] [0-9]*, \[MASK\] [0-9]*" "$T/out"
ok $? "  it prints the special tokens' ids"

before=$(snapshot)
run dataset tokenizer train docs --type unigram --vocab 1000 --normalize keep-accents,nfkc
is "$(rc)" 0 "train again with the same options"
is "$(sed -n 's/^tokenizer //p' "$T/out")" "$sha" "  the same model bytes (same sha256)"
is "$(snapshot)" "$before" "  and no new row"

run dataset tokenizer train docs --type bpe --vocab 800 --normalize nfkc,lowercase --special "[CLS],[SEP],[MASK]"
is "$(rc)" 0 "train a BPE tokenizer of 800 pieces, lowercased"
bpe=$(sed -n 's/^tokenizer //p' "$T/out")
is "$(q "SELECT trained_tokenizer FROM dataset WHERE name = 'docs'")" "$bpe" "  the dataset now names the new one"
is "$(q "SELECT count(*) FROM tokenizer")" 2 "  the first one is still recorded"

run files gc --grace 0
is "$(rc)" 0 "files gc with no grace period"
ok $([ -f "$f" ]; echo $?) "  leaves the tokenizer models in the store (their rows pin them)"

# ---- refusals change nothing ------------------------------------------------
before=$(snapshot)
refuse() { # exit status, words of the error, description, command...
	want=$1 words=$2 what=$3
	shift 3
	run "$@"
	is "$(rc)" "$want" "$what exits $want"
	err_has "$words"; ok $? "  says \"$words\": $(head -2 "$T/err" | tr '\n' ' ')"
	is "$(snapshot)" "$before" "  and changes nothing"
}
refuse 2 "bad option" "an unknown option" dataset tokenizer train docs --type unigram --vocab 100 --frobnicate
refuse 2 "unigram or bpe" "an unknown type" dataset tokenizer train docs --type wordpiece --vocab 100
refuse 2 "--vocab must be" "a vocabulary of 3" dataset tokenizer train docs --type unigram --vocab 3
refuse 1 "Vocabulary size too high" "a vocabulary larger than the text allows" \
	dataset tokenizer train docs --type unigram --vocab 900000
refuse 1 "unknown normalisation" "an unknown normalisation" \
	dataset tokenizer train docs --type unigram --vocab 100 --normalize nfkd
refuse 1 "given twice" "a special token given twice" \
	dataset tokenizer train docs --type unigram --vocab 100 --special "[CLS],[CLS]"
refuse 1 "does not exist" "a dataset that does not exist" dataset tokenizer train nope --type bpe --vocab 100

printf '\n\n\n\n' >"$T/blank.txt"
run dataset import --heldout-fraction 0 blank "$T/blank.txt"
is "$(rc)" 0 "import a dataset of blank lines only"
before=$(snapshot)
refuse 1 "no text" "training on blank lines" dataset tokenizer train blank --type unigram --vocab 100

# A damaged store: the text dataset's first shard replaced by a well-formed
# shard whose bytes are not UTF-8 (an import would have refused them).
printf 'Some text, then a bad byte: \377 and more text.\n' >"$T/bad.txt"
"$PY" - "$T/bad.txt" "$T/bad.shard" <<'PYEOF' || bail_out "cannot write the damaged shard"
import gzip, hashlib, io, json, sys, tarfile
tok = open(sys.argv[1], 'rb').read()
meta = json.dumps({"format": "cotrain-shard", "version": 1, "dataset": "mangled", "idx": 0,
                   "first_token": 0, "n_tokens": len(tok), "dtype": "u8", "tokenizer": "byte",
                   "tokens_sha256": hashlib.sha256(tok).hexdigest()}).encode()
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode='w', format=tarfile.USTAR_FORMAT) as t:
    for name, data in (("shard.json", meta), ("tokens.u8", tok)):
        i = tarfile.TarInfo(name); i.size = len(data); i.mode = 0o644
        t.addfile(i, io.BytesIO(data))
open(sys.argv[2], 'wb').write(gzip.compress(buf.getvalue(), mtime=0))
PYEOF
printf 'Some text, then a bad byte: x and more text.\n' >"$T/good.txt"
run dataset import --heldout-fraction 0 mangled "$T/good.txt"
is "$(rc)" 0 "import a small text dataset"
bsha=$(sha256sum "$T/bad.shard" | cut -d' ' -f1)
mkdir -p "$D/files/$(echo "$bsha" | cut -c1-2)"
cp "$T/bad.shard" "$D/files/$(echo "$bsha" | cut -c1-2)/$bsha"
q "INSERT INTO file (sha256, size, kind) VALUES ('$bsha', $(wc -c <"$T/bad.shard"), 'shard');
   UPDATE shard SET sha256 = '$bsha' WHERE dataset_id = (SELECT id FROM dataset WHERE name = 'mangled')" >/dev/null
before=$(snapshot)
refuse 1 "not valid UTF-8" "a dataset whose text is not UTF-8" dataset tokenizer train mangled --type bpe --vocab 40

# ---- import through a tokenizer ---------------------------------------------
before=$(snapshot)
refuse 1 "has no subword tokenizer" "import through a dataset without a tokenizer" \
	dataset import --tokenizer blank docsub "$top_srcdir/doc"
refuse 1 "does not exist" "import through a dataset that does not exist" \
	dataset import --tokenizer nope docsub "$top_srcdir/doc"
run dataset import --tokenizer docs docsub "$top_srcdir/doc"
is "$(rc)" 0 "import doc/ through the tokenizer trained on docs"
is "$(q "SELECT tokenizer || ' ' || vocab || ' ' || (tokenizer_sha256 = '$bpe') FROM dataset WHERE name = 'docsub'")" \
   "bpe 800 true" "  the dataset records the tokenizer and its vocabulary"
before=$(snapshot)
refuse 1 "hold bpe token ids, not text" "training on a dataset of token ids" \
	dataset tokenizer train docsub --type unigram --vocab 100

# ---- export -----------------------------------------------------------------
mkdir "$T/hf"
run dataset tokenizer export docs "$T/hf"
is "$(rc)" 0 "export the tokenizer trained on docs"
for x in tokenizer.json tokenizer_config.json special_tokens_map.json spiece.model; do
	ok $([ -s "$T/hf/$x" ]; echo $?) "  wrote $x"
done
is "$(sha256sum "$T/hf/spiece.model" | cut -d' ' -f1)" "$bpe" "  spiece.model is the stored model"
refuse 1 "has no subword tokenizer" "export from a dataset without one" dataset tokenizer export blank "$T/hf"

# tokenizer.json against SentencePiece's own Python encoder: the vocabulary,
# then the encoding of every line of doc/ through the `tokenizers` library
# where it is installed, else through tests/hf_tokenizer_reference.py (the
# format's rules, written from the library's documentation).
check_json() { # folder, description, casefold or nothing
	out=$("$PY" - "$1" "$top_srcdir/doc" "${3:-}" <<'PYEOF' 2>&1
import json, os, sys
import sentencepiece as spm
d, docs = sys.argv[1], sys.argv[2]
sp = spm.SentencePieceProcessor(model_file=os.path.join(d, "spiece.model"))
t = json.load(open(os.path.join(d, "tokenizer.json")))
m = t["model"]
n = sp.get_piece_size()
if m["type"] == "Unigram":
    assert len(m["vocab"]) == n, "vocab size"
    for i, (piece, score) in enumerate(m["vocab"]):
        assert piece == sp.id_to_piece(i), (i, piece)
        assert abs(score - sp.get_score(i)) <= 1e-6 * max(1, abs(score)), (i, score)
else:
    assert len(m["vocab"]) == n and all(m["vocab"][sp.id_to_piece(i)] == i for i in range(n)), "vocab"
    for mg in m["merges"]:
        a, b = mg.split(" ")
        assert sp.piece_to_id(a + b) != sp.unk_id(), mg
pp = t["post_processor"]["special_tokens"]
assert pp["[CLS]"]["ids"] == [sp.piece_to_id("[CLS]")] and pp["[SEP]"]["ids"] == [sp.piece_to_id("[SEP]")]
added = {a["content"]: a["id"] for a in t["added_tokens"]}
assert added["[MASK]"] == sp.piece_to_id("[MASK]"), "added [MASK]"
print("vocabulary of", n, m["type"], "pieces matches spiece.model")
# Where the two libraries differ by design, lines are left out: SentencePiece
# never matches its unknown and control pieces in text, where tokenizers
# matches every added token; and it puts its dummy space before a text that
# starts with an added token, where tokenizers does not.
ctl = [sp.id_to_piece(i) for i in range(n) if sp.is_unknown(i) or sp.is_control(i)]
lines = [l for f in sorted(os.listdir(docs)) for l in open(os.path.join(docs, f), encoding="utf-8").read().split("\n")
         if l and not any(c in l for c in ctl) and not any(l.startswith(a) for a in added)]
try:
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    enc, who = (lambda l: tk.encode(l, add_special_tokens=False).ids), "tokenizers"
except ImportError:
    sys.path.insert(0, os.environ["top_srcdir"] + "/tests")
    from hf_tokenizer_reference import Tokenizer
    tk = Tokenizer(os.path.join(d, "tokenizer.json"), casefold=sys.argv[3] == "casefold")
    enc, who = tk.encode, "tests/hf_tokenizer_reference.py (the tokenizers package is not installed)"
# A Unigram line may have two segmentations of the same score, summed in
# float by SentencePiece and in double here: such a tie is counted apart.
def tie(a, b):
    if m["type"] != "Unigram" or sp.decode(a) != sp.decode(b):
        return False
    return abs(sum(m["vocab"][i][1] for i in a) - sum(m["vocab"][i][1] for i in b)) <= 1e-4
diff = [l for l in lines if enc(l) != sp.encode(l)]
ties = [l for l in diff if tie(enc(l), sp.encode(l))]
bad = [l for l in diff if l not in ties]
print("encodings of", len(lines), "lines through", who, "equal sentencepiece's:", len(lines) - len(diff),
      "(and %d equal-score ties)" % len(ties))
assert not bad, [(l, enc(l), sp.encode(l)) for l in bad[:2]]
PYEOF
)
	st=$?
	ok $st "$2: $(echo "$out" | head -1)"
	[ $st -eq 0 ] || diag "$out"
	echo "$out" | grep -q "^encodings of .* equal sentencepiece's" && [ $st -eq 0 ]
	ok $? "  $(echo "$out" | tail -1 | cut -c1-200)"
}
if "$PY" -c "import sentencepiece" 2>/dev/null; then
	check_json "$T/hf" "BPE tokenizer.json" casefold
	run dataset tokenizer train docs --type unigram --vocab 1000 --normalize nfkc,keep-accents
	mkdir "$T/hf2"
	run dataset tokenizer export docs "$T/hf2"
	is "$(rc)" 0 "export the Unigram tokenizer (trained again: the same model)"
	check_json "$T/hf2" "Unigram tokenizer.json"
else
	skip 5 "$PY cannot import sentencepiece (packaging/install-deps.sh installs python3-sentencepiece)"
fi

done_testing
