"""cotrain tests: a reader of Hugging Face tokenizer.json written from the
tokenizers library's documented behaviour, for the subset that cotrain's
writer (kernels/hf_tokenizer.c) produces, so that tests/test_tokenizer_cli.sh
can check the exported file encodes like SentencePiece where the `tokenizers`
package is not installed:

  added tokens    split out of the raw text first, longest match first
  normalizer      "Precompiled" (SentencePiece's NFKC table) read as Unicode
                  NFKC, with case folding when the caller says the model
                  folds case (its nfkc_cf rule); null: the identity
  pre_tokenizer   Metaspace: spaces become U+2581, one is prepended to the
                  first section ("prepend_scheme": "first"), and the text is
                  split before each U+2581
  model           Unigram: the segmentation of each word with the highest
                  sum of piece scores (Viterbi), a character without a piece
                  scoring the lowest score less 10 as the unknown piece; BPE:
                  from characters, merge the adjacent pair of lowest merge
                  rank until none applies, a character outside the
                  vocabulary becoming the unknown piece; consecutive unknown
                  pieces are fused into one

    python3 hf_tokenizer_reference.py TOKENIZER_JSON TEXT_FILE [casefold]
prints one line of ids per line of the text file.
"""
import json
import sys
import unicodedata

SP = "\u2581"


class Tokenizer:
    def __init__(self, path, casefold=False):
        self.casefold = casefold
        t = json.load(open(path, encoding="utf-8"))
        self.added = {a["content"]: a["id"] for a in t["added_tokens"]}
        norm = t["normalizer"]
        assert norm is None or norm["type"] == "Precompiled", norm
        self.nfkc = norm is not None
        ms = t["pre_tokenizer"]
        assert ms["type"] == "Metaspace" and ms["replacement"] == SP, ms
        self.prepend = ms.get("prepend_scheme", "always" if ms.get("add_prefix_space") else "never")
        m = t["model"]
        self.type = m["type"]
        if self.type == "Unigram":
            self.score = {p: s for p, s in m["vocab"]}
            self.id = {p: i for i, (p, _) in enumerate(m["vocab"])}
            self.maxlen = max(len(p) for p in self.id)
            self.unk = m["unk_id"]
            self.unk_score = min(self.score.values()) - 10
        else:
            self.id = m["vocab"]
            self.rank = {tuple(mg.split(" ")): r for r, mg in enumerate(m["merges"])}
            self.unk = self.id[m["unk_token"]]

    def split_added(self, text):
        """[(segment, is_added)] of text, added tokens matched longest first."""
        out, i, start = [], 0, 0
        keys = sorted(self.added, key=len, reverse=True)
        while i < len(text):
            hit = next((k for k in keys if text.startswith(k, i)), None)
            if hit:
                if start < i:
                    out.append((text[start:i], False))
                out.append((hit, True))
                i += len(hit)
                start = i
            else:
                i += 1
        if start < len(text):
            out.append((text[start:], False))
        return out

    def words(self, segment, first):
        if self.nfkc:
            segment = unicodedata.normalize("NFKC", segment)
            if self.casefold:
                segment = unicodedata.normalize("NFKC", segment.casefold())
        s = segment.replace(" ", SP)
        if self.prepend == "always" or (self.prepend == "first" and first):
            s = SP + s
        words, cur = [], ""
        for ch in s:
            if ch == SP and cur:
                words.append(cur)
                cur = ""
            cur += ch
        if cur:
            words.append(cur)
        return words

    def unigram(self, w):
        best = [(0.0, None)] + [(-1e300, None)] * len(w)
        for end in range(1, len(w) + 1):
            for start in range(max(0, end - self.maxlen), end):
                p = w[start:end]
                known = p in self.score
                if (known or end - start == 1) and best[start][0] > -1e300:
                    s = best[start][0] + (self.score[p] if known else self.unk_score)
                    if s > best[end][0]:
                        best[end] = (s, start)
        ids, end = [], len(w)
        while end > 0:
            start = best[end][1]
            ids.append(self.id.get(w[start:end], self.unk))
            end = start
        return ids[::-1]

    def bpe(self, w):
        parts = list(w)
        while len(parts) > 1:
            ranks = [(self.rank.get((a, b), 1 << 60), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            r, i = min(ranks)
            if r == 1 << 60:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return [self.id.get(p, self.unk) for p in parts]

    def encode(self, text):
        ids, first = [], True
        for seg, is_added in self.split_added(text):
            if is_added:
                ids.append(self.added[seg])
            else:
                for w in self.words(seg, first):
                    ids.extend(self.unigram(w) if self.type == "Unigram" else self.bpe(w))
            first = False
        fused = []
        for i in ids:
            if not (i == self.unk and fused and fused[-1] == self.unk):
                fused.append(i)
        return fused


if __name__ == "__main__":
    tk = Tokenizer(sys.argv[1], len(sys.argv) > 3 and sys.argv[3] == "casefold")
    for line in open(sys.argv[2], encoding="utf-8").read().split("\n"):
        print(" ".join(map(str, tk.encode(line))))
