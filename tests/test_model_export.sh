#!/bin/sh
# cotrain tests: cotrain-admin model export, through the real path (a
# throwaway PostgreSQL, db migrate, dataset import, project create), proved
# to be exactly GPT-2: tests/gpt2_reference.py loads the folder by the
# GPT-2 names alone and runs its own GPT-2 forward in torch (and
# transformers' GPT2LMHeadModel where it can be imported) on real text,
# against cotrain's forward on the stored checkpoint.  Version 0 (the seed
# model) of an unshared model; a version of a model with n_shared < n_layer
# whose every parameter was moved off its seed value, so that a swapped
# bias or LayerNorm shows.  Then --format cotrain, cotrain-generate on a
# folder, and hostile arguments, each leaving nothing behind.
. "$top_srcdir/tests/tap.sh"

if [ -z "$COTRAIN_DB" ]; then
	exec "$top_builddir/tests/with-pgtmp" "$SHELL" "$0" "$@"
fi
A="$top_builddir/server/cotrain-admin"
G="$top_builddir/cotrain-generate"
X="$top_builddir/tests/hf_export_tool"
XE="$top_builddir/tests/encoder_export_tool"
REFE="$top_srcdir/tests/hf_encoder_reference.py"
PY="${TORCH_PYTHON:-/usr/bin/python3}"
REF="$top_srcdir/tests/gpt2_reference.py"
PSQL="$PG_BINDIR/psql"
[ -x "$PSQL" ] || PSQL=psql
command -v "$PSQL" >/dev/null 2>&1 || skip_all "psql not found"

T=$(mktemp -d /tmp/cot-export-XXXXXX)
trap 'rm -rf "$T"' EXIT INT TERM
chmod 755 "$T"
D="$T/data"
export COTRAIN_DATA_DIR="$D"
q() { "$PSQL" -X -A -t -q -c "$1" 2>&1; }
run() { "$A" "$@" >"$T/out" 2>"$T/err"; echo $? >"$T/rc"; }
rc() { cat "$T/rc"; }
err_has() { grep -q -- "$1" "$T/err"; }
store() { echo "$D/files/$(echo "$1" | cut -c1-2)/$1"; }
ckpt_of() { # PROJECT VERSION: the stored checkpoint's path
	store "$(q "SELECT v.checkpoint_sha256 FROM model_version v JOIN project p ON p.id = v.project_id
	            WHERE p.name = '$1' AND v.version = $2")"
}
# nothing but the listed entries in $T (no half-written export, no temporary folder)
leftovers() { ls -A "$T" | grep -v -x -e data -e out -e err -e rc -e text.txt -e p1.json -e p2.json \
	-e e1 -e e2 -e e3 -e e4 -e e5 -e e6 -e p3.json -e p4.json -e enc.data -e subenc.data -e empty -e full -e afile -e moved.safetensors -e l.f32 -e corrupt -e bad | tr '\n' ' '; }
has_torch=0
"$PY" -c 'import torch' 2>/dev/null && has_torch=1

run db migrate;                  is "$(rc)" 0 "db migrate"
# real text: this repository's design document
cp "$top_srcdir/doc/design.md" "$T/text.txt"
run dataset import --shard-tokens 4096 text "$T/text.txt"
is "$(rc)" 0 "import a dataset of real text"
cat >"$T/p1.json" <<'EOF'
{"name": "plain", "title": "Plain GPT", "description": "Three unshared blocks.", "dataset": "text",
 "license": "apache-2.0",
 "model": {"n_layer": 3, "n_head": 4, "d_model": 32, "d_ff": 80, "seq_len": 48},
 "optimizer": {"type": "adamw"}, "target_batch": 8, "microbatch_size": 4, "seed": 11}
EOF
sed -e '/"license"/d' -e 's/"plain"/"shared"/; s/Plain GPT/Shared GPT/; s/Three unshared blocks./Four blocks on two sets./' \
    -e 's/"n_layer": 3, "n_head": 4/"n_layer": 4, "n_shared": 2, "n_head": 2/' "$T/p1.json" >"$T/p2.json"
run project create "$T/p1.json"; is "$(rc)" 0 "create project plain (3 layers, unshared)"
run project create "$T/p2.json"; is "$(rc)" 0 "create project shared (4 layers on 2 parameter sets)"

# ---- version 0 of plain, the seed model ------------------------------------
run model export plain "$T/e1"
is "$(rc)" 0 "model export plain: $(cat "$T/out")"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json README.md; do
	[ -s "$T/e1/$f" ]; ok $? "  wrote $f"
done
is "$(stat -c %a "$T/e1")" 755 "  the folder is mode 755"
grep -q '"n_inner": 80' "$T/e1/config.json" && grep -q '"activation_function": "gelu_new"' "$T/e1/config.json"
ok $? "  config.json has n_inner 80 and gelu_new"
grep -q 'seed model' "$T/e1/README.md" && grep -q '`text`' "$T/e1/README.md" && grep -q 'token = byte' "$T/e1/README.md"
ok $? "  README.md names the dataset, the seed version and the byte tokenizer"
head -3 "$T/e1/README.md" | grep -q '^license: apache-2.0$'
ok $? "  and the project's licence in its header"
"$X" same "$T/e1" "$(ckpt_of plain 0)"
ok $? "  the folder reads back (hf_load_new) to the checkpoint's parameters, bit for bit"
"$X" logits "$(ckpt_of plain 0)" "$T/text.txt" "$T/l.f32"
ok $? "  cotrain's logits of the checkpoint"
if [ $has_torch = 1 ]; then
	"$PY" "$REF" "$T/e1" "$T/text.txt" "$T/l.f32" >"$T/out" 2>&1
	ok $? "  GPT-2 in torch by GPT-2 names: $(tail -1 "$T/out")"
else
	echo "ok $((_tap_n = _tap_n + 1)) - # SKIP $PY cannot import torch (packaging/install-deps.sh installs python3-torch)"
fi

# ---- a version of shared (n_shared < n_layer) with every parameter moved --------
"$X" perturb "$(ckpt_of shared 0)" "$T/moved.safetensors" 5
ok $? "a checkpoint whose biases and LayerNorm weights are off their seed values"
sha=$(sha256sum "$T/moved.safetensors" | cut -d' ' -f1)
mkdir -p "$(dirname "$(store "$sha")")" && cp "$T/moved.safetensors" "$(store "$sha")"
q "INSERT INTO file (sha256, size, kind) VALUES ('$sha', $(stat -c %s "$T/moved.safetensors"), 'checkpoint');
   INSERT INTO model_version (project_id, version, checkpoint_sha256)
     SELECT id, 1, '$sha' FROM project WHERE name = 'shared';
   UPDATE round SET loss = 2.3456, samples = 8, gradient_samples = 8, state = 'committed'
    WHERE version = 0 AND project_id = (SELECT id FROM project WHERE name = 'shared');
   UPDATE project SET current_version = 1 WHERE name = 'shared'" >"$T/out"
is "$(cat "$T/out")" "" "  stored as version 1, after a committed round of loss 2.3456"
run model export shared "$T/e2"
is "$(rc)" 0 "model export shared (the current version): $(cat "$T/out")"
grep -q 'version 1' "$T/out"; ok $? "  exports version 1, the current one"
grep -q '"cotrain_n_shared": 2' "$T/e2/config.json" && grep -q '"n_layer": 4' "$T/e2/config.json"
ok $? "  config.json: 4 layers, cotrain_n_shared 2"
grep -q '2.3456' "$T/e2/README.md" && grep -q '| samples | 8 ' "$T/e2/README.md" && grep -q '1 committed rounds' "$T/e2/README.md"
ok $? "  README.md has the last round's loss, the samples and the rounds"
"$X" same "$T/e2" "$T/moved.safetensors"
ok $? "  the folder reads back to the checkpoint's parameters"
"$X" logits "$T/moved.safetensors" "$T/text.txt" "$T/l.f32"
ok $? "  cotrain's logits of the checkpoint"
if [ $has_torch = 1 ]; then
	"$PY" "$REF" "$T/e2" "$T/text.txt" "$T/l.f32" >"$T/out" 2>&1
	ok $? "  GPT-2 in torch by GPT-2 names: $(tail -1 "$T/out")"
	"$PY" "$REF" --transformers "$T/e2" "$T/text.txt" "$T/l.f32" >"$T/out" 2>&1
	st=$?
	if [ $st = 3 ]; then
		echo "ok $((_tap_n = _tap_n + 1)) - # SKIP GPT2LMHeadModel.from_pretrained: $(tail -1 "$T/out")"
	else
		ok $st "  transformers' GPT2LMHeadModel.from_pretrained: $(tail -1 "$T/out")"
	fi
else
	echo "ok $((_tap_n = _tap_n + 1)) - # SKIP $PY cannot import torch"
	echo "ok $((_tap_n = _tap_n + 1)) - # SKIP $PY cannot import torch"
fi
# the reference must be able to fail: a folder with two tensors swapped
cp -r "$T/e2" "$T/bad"
"$PY" - "$T/bad/model.safetensors" <<'EOF' 2>/dev/null
import json, struct, sys
p = sys.argv[1]
raw = open(p, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
a, b = h["h.1.ln_1.bias"], h["h.1.ln_2.bias"]
a["data_offsets"], b["data_offsets"] = b["data_offsets"], a["data_offsets"]
s = json.dumps(h).encode()
s += b" " * (-len(s) % 8)
open(p, "wb").write(struct.pack("<Q", len(s)) + s + raw[8 + n:])
EOF
if [ $has_torch = 1 ]; then
	"$PY" "$REF" "$T/bad" "$T/text.txt" "$T/l.f32" >"$T/out" 2>&1
	is "$?" 1 "  the reference fails when ln_1.bias and ln_2.bias of one layer are swapped: $(tail -1 "$T/out")"
else
	echo "ok $((_tap_n = _tap_n + 1)) - # SKIP $PY cannot import torch"
fi
"$G" -c "$T/bad" -n 4 >/dev/null 2>"$T/err"
is "$?" 1 "  cotrain-generate refuses it: layers 0 and 1 share a set but now differ"
err_has "shares its parameter set"; ok $? "  $(head -1 "$T/err")"
rm -rf "$T/bad"

# ---- an encoder project: the ALBERT layout -----------------------------------
# (its names and numbers in depth: tests/test_encoder_export.sh)
cat >"$T/p3.json" <<'EOF'
{"name": "enc", "title": "Tiny ALBERT", "dataset": "text",
 "model": {"arch": "albert", "n_layer": 2, "n_shared": 1, "n_head": 2, "d_model": 32, "d_embed": 16,
           "d_ff": 64, "seq_len": 24},
 "optimizer": {"type": "lamb"}, "target_batch": 8, "microbatch_size": 4, "seed": 5}
EOF
run project create "$T/p3.json"; is "$(rc)" 0 "create project enc (an ALBERT on the byte tokenizer)"
run model export enc "$T/e4"
is "$(rc)" 0 "model export enc: $(cat "$T/out")"
grep -q '"model_type": "albert"' "$T/e4/config.json" && grep -q '"num_hidden_groups": 1' "$T/e4/config.json" &&
	grep -q 'AlbertForPreTraining' "$T/e4/README.md" && grep -q '\[MASK\] 258' "$T/e4/README.md"
ok $? "  config.json is an ALBERT's, and the model card says so and names the special tokens"
if [ $has_torch = 1 ]; then
	"$XE" logits "$(ckpt_of enc 0)" "$T/enc.data" && "$PY" "$REFE" "$T/e4" "$T/enc.data" >"$T/out" 2>&1
	ok $? "  a torch loader reading only the HF names gives the stored checkpoint's MLM logits: $(head -1 "$T/out")"
else
	echo "ok $((_tap_n = _tap_n + 1)) - # SKIP $PY cannot import torch"
fi
"$G" -c "$(ckpt_of enc 0)" -p "x" >/dev/null 2>"$T/err"
is "$?" 2 "  cotrain-generate will not generate with an encoder: $(head -1 "$T/err")"
"$G" -c "$(ckpt_of enc 0)" --fill-mask "The [MASK]ound" -P 3 >"$T/out" 2>"$T/err"
grep -q '^\[MASK\] 1 of 1:' "$T/out" && grep -q '^filled: The .*ound$' "$T/out"
ok $? "  cotrain-generate --fill-mask prints the seed model's predictions: $(head -1 "$T/out")"
"$G" -c "$(ckpt_of plain 0)" --fill-mask "The [MASK]" >/dev/null 2>"$T/err"
is "$?" 1 "  --fill-mask refuses a gpt: $(head -1 "$T/err")"

# ---- a subword ALBERT: the tokenizer goes with it --------------------------------
run dataset tokenizer train text --type unigram --vocab 400
is "$(rc)" 0 "train a Unigram tokenizer of 400 pieces on the text"
run dataset import --shard-tokens 4096 --tokenizer text subtext "$T/text.txt"
is "$(rc)" 0 "import the text through it"
sed -e 's/"enc"/"subenc"/; s/Tiny ALBERT/Subword ALBERT/; s/"dataset": "text"/"dataset": "subtext", "tokenizer": "dataset"/' \
    -e 's/"seq_len": 24}/"seq_len": 24, "vocab": 400}/' "$T/p3.json" >"$T/p4.json"
run project create "$T/p4.json"; is "$(rc)" 0 "create project subenc (an ALBERT on the tokenizer's ids)"
TSHA=$(q "SELECT tokenizer_sha256 FROM dataset WHERE name = 'subtext'")
run model export subenc "$T/e5"
is "$(rc)" 0 "model export subenc: $(cat "$T/out")"
cmp -s "$T/e5/spiece.model" "$(store "$TSHA")" &&
	grep -q '"TemplateProcessing"' "$T/e5/tokenizer.json" &&
	"$PY" -c '
import json, sys
d = sys.argv[1]
t = json.load(open(d + "/tokenizer.json"))["post_processor"]
pair = [list(x.values())[0]["id"] for x in t["pair"]]
ok = [list(x.values())[0]["id"] for x in t["single"]] == ["[CLS]", "A", "[SEP]"] and pair == ["[CLS]", "A", "[SEP]", "B", "[SEP]"]
m = json.load(open(d + "/special_tokens_map.json"))
c = json.load(open(d + "/tokenizer_config.json"))
ok = ok and m == {"unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]"}
ok = ok and c["tokenizer_class"] == "AlbertTokenizer" and c["mask_token"] == "[MASK]"
ok = ok and json.load(open(d + "/config.json"))["pad_token_id"] == 1
sys.exit(0 if ok else 1)' "$T/e5"
ok $? "  with spiece.model (the stored tokenizer), tokenizer.json ([CLS] A [SEP] B [SEP]), tokenizer_config.json, special_tokens_map.json; pad_token_id 1"
grep -q 'SentencePiece unigram model of 400 pieces' "$T/e5/README.md" && grep -q "\[MASK\] 7, \[PAD\] 1" "$T/e5/README.md" &&
	! grep -q 'byte-level' "$T/e5/README.md"
ok $? "  the model card names the tokenizer and its special ids"
if [ $has_torch = 1 ]; then
	"$XE" logits "$(ckpt_of subenc 0)" "$T/subenc.data" && "$PY" "$REFE" "$T/e5" "$T/subenc.data" >"$T/out" 2>&1
	ok $? "  a torch loader reading only the HF names gives the subword checkpoint's MLM logits within 1e-4: $(head -1 "$T/out")"
else
	echo "ok $((_tap_n = _tap_n + 1)) - # SKIP $PY cannot import torch"
fi
run model export --format cotrain subenc "$T/e6"
is "$(rc)" 0 "model export --format cotrain subenc"
"$G" -c "$T/e6" --fill-mask "The [MASK] of the server" -P 3 >"$T/out" 2>"$T/err"
grep -Eq '^\[MASK\] 1 of 1: "[^"]+" 0\.[0-9]{3} "[^"]+" 0\.[0-9]{3} "[^"]+" 0\.[0-9]{3}$' "$T/out" &&
	grep -q '^filled: The.* of the server$' "$T/out"
ok $? "  cotrain-generate --fill-mask on the exported folder reads its spiece.model: $(head -1 "$T/out" "$T/err")"
"$G" -c "$(ckpt_of subenc 0)" --tokenizer "$T/e6/spiece.model" --fill-mask "The [MASK] of the server" -P 3 >"$T/err" 2>&1
cmp -s "$T/out" "$T/err"
ok $? "  and on the stored checkpoint with --tokenizer, the same predictions"
"$G" -c "$(ckpt_of enc 0)" --tokenizer "$T/e6/spiece.model" --fill-mask "The [MASK]" >/dev/null 2>"$T/err"
is "$?" 1 "  --tokenizer refuses a model of another vocabulary: $(head -1 "$T/err")"
"$G" -c "$T/e5" --fill-mask "The [MASK]" >/dev/null 2>"$T/err"
[ $? = 1 ] && err_has 'model_type is "albert"' && err_has 'format cotrain'
ok $? "  --fill-mask on the hf folder says what it reads instead: $(tail -1 "$T/err")"

# ---- cotrain-generate on a folder ---------------------------------------------
"$G" -c "$T/moved.safetensors" -p "The round " -n 40 -k 1 >"$T/out" 2>&1
"$G" -c "$T/e2" -p "The round " -n 40 -k 1 >"$T/err" 2>&1
st=$?
[ $st = 0 ] && cmp -s "$T/out" "$T/err"
ok $? "cotrain-generate --checkpoint DIR gives the checkpoint's text"
sed 's/"gelu_new"/"relu"/' "$T/e2/config.json" >"$T/out" && cp -r "$T/e2" "$T/bad" && cp "$T/out" "$T/bad/config.json"
"$G" -c "$T/bad" -n 4 >/dev/null 2>"$T/err"
is "$?" 1 "cotrain-generate refuses a folder whose activation is not gelu_new"
err_has 'activation_function is "relu"'; ok $? "  $(head -1 "$T/err")"
rm -rf "$T/bad"

# ---- --format cotrain -----------------------------------------------------------
run model export --version 0 --format cotrain shared "$T/e3"
is "$(rc)" 0 "model export --format cotrain --version 0"
cmp -s "$T/e3/checkpoint.safetensors" "$(ckpt_of shared 0)"
ok $? "  checkpoint.safetensors is the stored checkpoint, optimizer state included"
grep -q 'opt.m' "$T/e3/README.md" && grep -q 'seed model' "$T/e3/README.md"
ok $? "  with its README.md"

# ---- hostile arguments: a clear error, nothing written -----------------------------
sed -e 's/"plain"/"lic"/; s/"apache-2.0"/"MIT\\nlicense: x"/' "$T/p1.json" >"$T/bad"
run project create "$T/bad"
[ "$(rc)" = 1 ] && err_has 'field "license" is not a licence identifier'
ok $? "project create refuses a licence that is no identifier: $(head -1 "$T/err")"
is "$(q "SELECT count(*) FROM project WHERE name = 'lic'")" 0 "  and creates nothing"
rm -f "$T/bad"
mkdir "$T/empty"
run model export plain "$T/empty"
is "$(rc)" 0 "an existing empty folder is filled"
[ -f "$T/empty/model.safetensors" ]; ok $? "  with the model"
mkdir "$T/full" && echo keep >"$T/full/mine.txt"
hostile() { # DESC RC MESSAGE ARGS...
	_d=$1 _r=$2 _m=$3; shift 3
	run "$@"
	[ "$(rc)" = "$_r" ] && err_has "$_m"
	ok $? "refuse $_d (exit $_r): $(head -1 "$T/err")"
}
hostile "a missing project"       1 'project "nosuch" does not exist' model export nosuch "$T/x1"
hostile "a missing version"       1 'has no model version 7'          model export plain --version 7 "$T/x2"
err_has "versions are 0 to 0";  ok $? "  the hint gives the versions"
hostile "a non-empty folder"      1 'the folder is not empty'         model export plain "$T/full"
is "$(ls "$T/full")" "mine.txt" "  its contents are untouched"
echo x >"$T/afile"
hostile "a file in the way"       1 'is not a folder'                 model export plain "$T/afile"
hostile "a missing parent"        1 'does not exist'                  model export plain "$T/no/such/dir"
hostile "an unwritable parent"    1 'could not create a folder'       model export plain /proc/cotrain-export-test
hostile "a bad --version"         2 'version must be an integer'      model export --version x plain "$T/x3"
hostile "a negative --version"    2 'version must be an integer'      model export --version -1 plain "$T/x3"
hostile "an unknown --format"     2 'format must be'                  model export --format onnx plain "$T/x3"
hostile "a missing DIR"           2 'give a PROJECT and a DIR'        model export plain
hostile "an unknown command"      2 'unknown command'                 model import plain "$T/x3"
# a checkpoint whose bytes no longer match its name
bad=$(printf 'f%.0s' $(seq 64))
mkdir -p "$(dirname "$(store "$bad")")" && cp "$T/moved.safetensors" "$(store "$bad")"
q "INSERT INTO file (sha256, size, kind) VALUES ('$bad', 1, 'checkpoint');
   INSERT INTO model_version (project_id, version, checkpoint_sha256)
     SELECT id, 2, '$bad' FROM project WHERE name = 'shared'" >/dev/null
hostile "a damaged stored checkpoint" 1 'its checkpoint' model export shared --version 2 "$T/corrupt"
[ ! -e "$T/corrupt" ]; ok $? "  no folder appears"
is "$(leftovers)" "" "no temporary folder or partial export is left behind"
run model --help;                is "$(rc)" 0 "model --help exits 0"
grep -q 'from_pretrained' "$T/out"; ok $? "  and explains the hf format"

done_testing
