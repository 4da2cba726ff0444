#!/bin/sh
# cotrain tests: the encoders' Hugging Face export (kernels/hf_albert.h).
# For ALBERT (4 layers on 2 shared groups, factorised embedding) and BERT:
# tests/encoder_export_tool builds a model with every parameter off its
# seed value, checks its checkpoint reads back bit for bit, exports it and
# writes cotrain's MLM logits on a batch; tests/hf_encoder_reference.py
# loads the folder by the Hugging Face names alone and computes the logits
# with its own torch forward (within 1e-4), and through transformers'
# AlbertForPreTraining / BertForPreTraining where transformers can be
# imported (else it says SKIP and why, and so does this test).  The same
# for ALBERT with relative_key positions and BERT with relative_key_query
# (config.json's position_embedding_type, each group's distance_embedding).
. "$top_srcdir/tests/tap.sh"

X="$top_builddir/tests/encoder_export_tool"
PY="${TORCH_PYTHON:-/usr/bin/python3}"
REF="$top_srcdir/tests/hf_encoder_reference.py"
T=$(mktemp -d /tmp/cot-encexport-XXXXXX)
trap 'rm -rf "$T"' EXIT INT TERM
has_torch=0
"$PY" -c 'import torch' 2>/dev/null && has_torch=1

for arch in albert bert albert:relative_key bert:relative_key_query; do
	mkdir "$T/$arch"
	"$X" $arch "$T/$arch" "$T/$arch.data" 2>"$T/err"
	ok $? "$arch: exported, and its checkpoint reads back bit for bit $(cat "$T/err")"
	grep -q "\"model_type\": \"${arch%%:*}\"" "$T/$arch/config.json" && grep -q '"layer_norm_eps": 1e-12' "$T/$arch/config.json"
	ok $? "$arch: config.json names the model type and eps 1e-12"
	if [ $has_torch = 1 ]; then
		"$PY" "$REF" "$T/$arch" "$T/$arch.data" >"$T/out" 2>&1
		st=$?
		diag "$(cat "$T/out")"
		grep -q '^ok: logits from the HF names alone' "$T/out"
		ok $? "$arch: a torch loader reading only the HF names gives cotrain's MLM logits within 1e-4"
		if grep -q '^SKIP transformers' "$T/out"; then
			echo "ok $((_tap_n + 1)) # SKIP $(grep '^SKIP transformers' "$T/out" | cut -c6-)"
			_tap_n=$((_tap_n + 1))
		else
			ok $st "$arch: transformers' from_pretrained gives cotrain's MLM logits within 1e-4"
		fi
	else
		echo "ok $((_tap_n + 1)) # SKIP no torch for $PY"
		echo "ok $((_tap_n + 2)) # SKIP no torch for $PY"
		_tap_n=$((_tap_n + 2))
	fi
done
grep -q '"num_hidden_groups": 2' "$T/albert/config.json" && grep -q '"embedding_size": 16' "$T/albert/config.json"
ok $? "albert: config.json has num_hidden_groups 2 and embedding_size 16"
grep -q '"hidden_act": "gelu"' "$T/bert/config.json"
ok $? "bert: config.json has the exact gelu"
grep -q '"position_embedding_type": "absolute"' "$T/albert/config.json" &&
	grep -q '"position_embedding_type": "relative_key"' "$T/albert:relative_key/config.json" &&
	grep -q '"position_embedding_type": "relative_key_query"' "$T/bert:relative_key_query/config.json"
ok $? "config.json names each model's position_embedding_type"
done_testing
