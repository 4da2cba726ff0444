#!/bin/sh
# tests/bench/bench-tokenizer.sh [VOCAB [TYPE]]: subword tokenizer training
# time and encoding speed on the demo's text, through cotrain's shim
# (tests/bench/bench_tokenizer) beside SentencePiece's own command line
# programs (spm_train, spm_encode, Debian package sentencepiece) on the same
# file, with the same settings (model type, vocabulary, NFKC, full character
# coverage, every sentence, no shuffling, 2 threads), measured in the same
# run.  Prints the figures and the ratios (reference / cotrain: above 1 means
# cotrain is faster).
#
# The text: packaging/fetch-sotu.sh's State of the Union addresses (what
# packaging/demo.sh trains on; fetched once into its cache, offline after),
# else packaging/demo/corpus.txt.  Run from the build folder:
#   make tests/bench/bench_tokenizer && ../tests/bench/bench-tokenizer.sh 8000
set -eu
VOCAB=${1:-8000}
TYPE=${2:-unigram}
top_srcdir=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
B=${top_builddir:-.}
[ -x "$B/tests/bench/bench_tokenizer" ] || { echo "bench-tokenizer: build tests/bench/bench_tokenizer first" >&2; exit 2; }
command -v spm_train >/dev/null && command -v spm_encode >/dev/null ||
	{ echo "bench-tokenizer: SKIP spm_train and spm_encode not found (Debian package sentencepiece)"; exit 0; }
T=$(mktemp -d /tmp/bench-tokenizer-XXXXXX)
trap 'rm -rf "$T"' EXIT INT TERM

if dir=$("$top_srcdir/packaging/fetch-sotu.sh" "$T/text" 2>/dev/null); then
	what="the demo's State of the Union addresses"
	# the files in sorted order joined by blank lines: the dataset's stream
	first=1
	for f in $(cd "$dir" && find . -type f ! -name '.*' | LC_ALL=C sort); do
		[ $first -eq 1 ] || printf '\n\n' >>"$T/corpus.txt"
		cat "$dir/$f" >>"$T/corpus.txt"
		first=0
	done
else
	what="packaging/demo/corpus.txt (the addresses could not be fetched)"
	cp "$top_srcdir/packaging/demo/corpus.txt" "$T/corpus.txt"
fi
# Long lines folded at blanks to at most 4000 bytes: spm_train skips a line
# over its max_sentence_length where cotrain's shim cuts it, so both read
# the same sentences only when none is that long.
fold -s -b -w 4000 "$T/corpus.txt" >"$T/folded.txt" && mv "$T/folded.txt" "$T/corpus.txt"
echo "text: $what, $(wc -c <"$T/corpus.txt") bytes, $(wc -l <"$T/corpus.txt") lines; $TYPE, vocabulary $VOCAB"

now() { date +%s.%N; }
"$B/tests/bench/bench_tokenizer" "$T/corpus.txt" "$TYPE" "$VOCAB" "$T/ours.model" >"$T/ours.txt"
ours_train=$(sed -n 's/^train_seconds //p' "$T/ours.txt")
ours_enc=$(sed -n 's/^encode_seconds //p' "$T/ours.txt")
ours_tok=$(sed -n 's/^tokens //p' "$T/ours.txt")

t0=$(now)
spm_train --input="$T/corpus.txt" --model_prefix="$T/ref" --model_type="$TYPE" --vocab_size="$VOCAB" \
	--normalization_rule_name=nfkc --remove_extra_whitespaces=false --character_coverage=1.0 \
	--num_threads=2 --input_sentence_size=0 --shuffle_input_sentence=false --max_sentence_length=16384 \
	--bos_id=-1 --eos_id=-1 --unk_piece='[UNK]' --pad_id=1 --pad_piece='[PAD]' \
	--user_defined_symbols='[CLS],[SEP],[MASK]' --random_seed=20240601 --minloglevel=2 >/dev/null 2>"$T/ref.err" ||
	{ cat "$T/ref.err" >&2; exit 1; }
t1=$(now)
spm_encode --model="$T/ref.model" --output_format=id <"$T/corpus.txt" >"$T/ref.ids"
t2=$(now)
ref_train=$(echo "$t1 - $t0" | bc -l)
ref_enc=$(echo "$t2 - $t1" | bc -l)
ref_tok=$(wc -w <"$T/ref.ids")

printf 'training: cotrain %.2f s, spm_train %.2f s: ratio %.2f\n' "$ours_train" "$ref_train" \
	"$(echo "$ref_train / $ours_train" | bc -l)"
printf 'encoding: cotrain %.2f s (%s tokens), spm_encode %.2f s (%s tokens, with writing them): ratio %.2f\n' \
	"$ours_enc" "$ours_tok" "$ref_enc" "$ref_tok" "$(echo "$ref_enc / $ours_enc" | bc -l)"
printf 'encoding speed: cotrain %.2f MB/s\n' "$(echo "$(wc -c <"$T/corpus.txt") / $ours_enc / 1000000" | bc -l)"
