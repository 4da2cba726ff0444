// cotrain kernels: the SentencePiece shim (see spm.h).  The only C++ in
// cotrain: every exception and every util::Status stops here and becomes a
// cot_err with a message in PostgreSQL's style.
#include "kernels/spm.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

// Exported by libsentencepiece but not declared in its public headers: the
// trainer's log level (0 info, 1 warning, 2 error).  Training is quiet
// unless it fails; the failure comes back as a util::Status.
namespace sentencepiece
{
namespace logging
{
int GetMinLogLevel();
void SetMinLogLevel(int v);
}   // namespace logging
}   // namespace sentencepiece

struct spm_model {
	sentencepiece::SentencePieceProcessor proc;
	std::string bytes;
};

namespace
{

// The training text as sentences: one per line, empty lines skipped, a
// line longer than SPM_SENTENCE_MAX cut at the last character boundary
// before it.
class LineIterator : public sentencepiece::SentenceIterator
{
      public:
	LineIterator(const char *text, size_t len) : p_(text), end_(text + len) { Next(); }
	bool done() const override { return done_; }
	void Next() override
	{
		for (;;) {
			if (p_ >= end_) {
				done_ = true;
				return;
			}
			const char *nl = static_cast<const char *>(memchr(p_, '\n', (size_t)(end_ - p_)));
			const char *stop = nl ? nl : end_;
			size_t n = (size_t)(stop - p_);
			if (n > SPM_SENTENCE_MAX) {
				n = SPM_SENTENCE_MAX;
				while (n > 0 && (static_cast<unsigned char>(p_[n]) & 0xC0) == 0x80)
					n--;   // do not split a character
			}
			const char *line = p_;
			p_ = nl ? nl + 1 : end_;
			if (n > 0) {
				value_.assign(line, n);
				return;
			}
		}
	}
	const std::string &value() const override { return value_; }
	sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

      private:
	const char *p_, *end_;
	std::string value_;
	bool done_ = false;
};

std::string join_user_symbols(const spm_train_opts *o)
{
	// Newline, tab and carriage return are pieces of their own: SentencePiece
	// would otherwise map these control characters to the unknown piece, and
	// a stream of documents (joined by blank lines) would not round-trip.
	std::string s = "\n,\t,\r";
	for (int i = 0; i < o->n_special; i++) {
		if (!strcmp(o->special[i], "[UNK]") || !strcmp(o->special[i], "[PAD]"))
			continue;
		s += ",";
		s += o->special[i];
	}
	return s;
}

// SentencePiece's reason without its source position: its messages read
// "./src/file.cc(660) [condition] reason"; an empty reason leaves the
// condition.
std::string reason(const sentencepiece::util::Status &st)
{
	std::string m = st.message();
	size_t open = m.find(") [");
	size_t close = open == std::string::npos ? std::string::npos : m.find("] ", open);
	if (close == std::string::npos)
		return m;
	std::string rest = m.substr(close + 2);
	while (!rest.empty() && rest.back() == ' ')
		rest.pop_back();
	return rest.empty() ? m.substr(open + 2, close + 1 - (open + 2)) : rest;
}

bool has_text(const char *text, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (text[i] != '\n')
			return true;
	return false;
}

}   // namespace

extern "C" cot_err spm_train(const char *text, size_t len, const spm_train_opts *o, unsigned char **model,
                             size_t *model_len, cot_errbuf *eb)
{
	*model = nullptr;
	*model_len = 0;
	if (o->vocab < SPM_VOCAB_MIN || o->vocab > SPM_VOCAB_MAX)
		return cot_seterr(eb, COT_ERR_INVALID, "vocabulary size %d is out of range: use %d to %d",
		                  o->vocab, SPM_VOCAB_MIN, SPM_VOCAB_MAX);
	if (o->n_special < 0 || o->n_special > SPM_SPECIAL_MAX)
		return cot_seterr(eb, COT_ERR_INVALID, "too many special tokens: at most %d",
		                  SPM_SPECIAL_MAX);
	if ((o->normalize & SPM_NORM_LOWERCASE) && !(o->normalize & SPM_NORM_NFKC))
		return cot_seterr(eb, COT_ERR_INVALID, "normalisation \"lowercase\" needs \"nfkc\"");
	if (!has_text(text, len))
		return cot_seterr(eb, COT_ERR_INVALID, "cannot train a tokenizer on no text");
	try {
		std::unordered_map<std::string, std::string> kw;
		kw["model_type"] = o->type == SPM_BPE ? "bpe" : "unigram";
		kw["vocab_size"] = std::to_string(o->vocab);
		kw["normalization_rule_name"] = (o->normalize & SPM_NORM_LOWERCASE) ? "nfkc_cf"
		                                : (o->normalize & SPM_NORM_NFKC)    ? "nfkc"
		                                                                    : "identity";
		kw["remove_extra_whitespaces"] = "false";   // text round-trips
		kw["character_coverage"] = "1.0";           // every character of the corpus has a piece
		kw["num_threads"] = std::to_string(SPM_TRAIN_THREADS);
		kw["input_sentence_size"] = "0";   // every sentence, no sampling
		kw["shuffle_input_sentence"] = "false";
		kw["max_sentence_length"] = std::to_string(SPM_SENTENCE_MAX);
		kw["hard_vocab_limit"] = "true";
		kw["bos_id"] = "-1";
		kw["eos_id"] = "-1";
		kw["pad_id"] = "-1";
		kw["unk_id"] = "0";
		// A piece never spans a space in its middle, nor is made of spaces
		// alone: what Hugging Face's Metaspace pre-tokenizer can express, so
		// the exported tokenizer.json encodes as SentencePiece does.
		kw["allow_whitespace_only_pieces"] = "false";
		kw["split_by_whitespace"] = "true";
		kw["user_defined_symbols"] = join_user_symbols(o);
		for (int i = 0; i < o->n_special; i++) {
			if (!strcmp(o->special[i], "[UNK]"))
				kw["unk_piece"] = "[UNK]";
			if (!strcmp(o->special[i], "[PAD]")) {
				kw["pad_id"] = "1";
				kw["pad_piece"] = "[PAD]";
			}
		}
		sentencepiece::SetRandomGeneratorSeed(SPM_TRAIN_SEED);
		int level = sentencepiece::logging::GetMinLogLevel();
		sentencepiece::logging::SetMinLogLevel(2);
		LineIterator it(text, len);
		std::string out;
		auto st = sentencepiece::SentencePieceTrainer::Train(kw, &it, &out);
		sentencepiece::logging::SetMinLogLevel(level);
		if (!st.ok()) {
			cot_seterr(eb, COT_ERR_INVALID, "cannot train the tokenizer: %.300s",
			           reason(st).c_str());
			if (strstr(st.message(), "Vocabulary size"))
				cot_sethint(eb, "Give a smaller --vocab, or train on more text.");
			return COT_ERR_INVALID;
		}
		unsigned char *buf = static_cast<unsigned char *>(malloc(out.size() ? out.size() : 1));
		if (!buf)
			return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
		memcpy(buf, out.data(), out.size());
		*model = buf;
		*model_len = out.size();
		return COT_OK;
	} catch (const std::bad_alloc &) {
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	} catch (const std::exception &e) {
		return cot_seterr(eb, COT_ERR_INVALID, "cannot train the tokenizer: %.300s", e.what());
	}
}

extern "C" cot_err spm_load(const void *bytes, size_t len, spm_model **out, cot_errbuf *eb)
{
	*out = nullptr;
	try {
		spm_model *m = new spm_model;
		m->bytes.assign(static_cast<const char *>(bytes), len);
		auto st = m->proc.LoadFromSerializedProto(m->bytes);
		if (!st.ok() || m->proc.GetPieceSize() < 1) {
			cot_seterr(eb, COT_ERR_CORRUPT,
			           "tokenizer model of %zu bytes is not a SentencePiece model%s", len,
			           st.ok() ? ": it has no pieces" : "");
			delete m;
			return COT_ERR_CORRUPT;
		}
		*out = m;
		return COT_OK;
	} catch (const std::bad_alloc &) {
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	} catch (const std::exception &e) {
		return cot_seterr(eb, COT_ERR_CORRUPT, "tokenizer model is not a SentencePiece model: %.300s",
		                  e.what());
	}
}

extern "C" void spm_free(spm_model *m) { delete m; }

extern "C" int spm_vocab_size(const spm_model *m) { return m->proc.GetPieceSize(); }

extern "C" int spm_piece_id(const spm_model *m, const char *piece)
{
	int id = m->proc.PieceToId(piece);
	// PieceToId answers unk_id for a piece it does not know.
	if (id < 0 || (id == m->proc.unk_id() && m->proc.IdToPiece(id) != piece))
		return -1;
	return id;
}

extern "C" const char *spm_piece(const spm_model *m, int id)
{
	if (id < 0 || id >= m->proc.GetPieceSize())
		return nullptr;
	return m->proc.IdToPiece(id).c_str();
}

extern "C" const unsigned char *spm_bytes(const spm_model *m, size_t *len)
{
	*len = m->bytes.size();
	return reinterpret_cast<const unsigned char *>(m->bytes.data());
}

extern "C" cot_err spm_encode(const spm_model *m, const char *text, size_t len, int32_t **ids, size_t *n,
                              cot_errbuf *eb)
{
	*ids = nullptr;
	*n = 0;
	try {
		std::vector<int> v;
		auto st = m->proc.Encode(std::string(text, len), &v);
		if (!st.ok())
			return cot_seterr(eb, COT_ERR_INVALID, "could not encode text: %.300s",
			                  reason(st).c_str());
		if (v.empty())
			return COT_OK;
		int32_t *out = static_cast<int32_t *>(malloc(v.size() * sizeof *out));
		if (!out)
			return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
		for (size_t i = 0; i < v.size(); i++)
			out[i] = v[i];
		*ids = out;
		*n = v.size();
		return COT_OK;
	} catch (const std::bad_alloc &) {
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
}

extern "C" cot_err spm_decode(const spm_model *m, const int32_t *ids, size_t n, char **text, size_t *len,
                              cot_errbuf *eb)
{
	*text = nullptr;
	*len = 0;
	int size = m->proc.GetPieceSize();
	try {
		std::vector<int> v(n);
		for (size_t i = 0; i < n; i++) {
			if (ids[i] < 0 || ids[i] >= size)
				return cot_seterr(eb, COT_ERR_INVALID,
				                  "token %d at position %zu is outside the vocabulary 0..%d",
				                  (int)ids[i], i, size - 1);
			v[i] = ids[i];
		}
		std::string s;
		auto st = m->proc.Decode(v, &s);
		if (!st.ok())
			return cot_seterr(eb, COT_ERR_INVALID, "could not decode tokens: %.300s",
			                  reason(st).c_str());
		char *out = static_cast<char *>(malloc(s.size() + 1));
		if (!out)
			return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
		memcpy(out, s.data(), s.size());
		out[s.size()] = '\0';
		*text = out;
		*len = s.size();
		return COT_OK;
	} catch (const std::bad_alloc &) {
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
}
