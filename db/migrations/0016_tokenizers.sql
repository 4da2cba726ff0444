-- cotrain schema, version 16: subword tokenizers (doc/dataset.md,
-- "Tokenizers").
--
-- tokenizer: a SentencePiece model trained by `cotrain-admin dataset
-- tokenizer train`, kept in the file store (file kind 'tokenizer') under its
-- sha256; the row pins the file (the collector never removes a file a
-- tokenizer row names).  dataset.trained_tokenizer: the last tokenizer
-- trained on the dataset's text; dataset.tokenizer_sha256: the tokenizer
-- its shards are encoded with (NULL for the byte tokenizer), and
-- dataset.vocab its vocabulary.

ALTER TABLE file DROP CONSTRAINT file_kind_check;
ALTER TABLE file ADD CONSTRAINT file_kind_check
    CHECK (kind IN ('shard', 'manifest', 'checkpoint', 'tokenizer'));

CREATE TABLE tokenizer (
    sha256      text PRIMARY KEY REFERENCES file (sha256),
    type        text NOT NULL CHECK (type IN ('unigram', 'bpe')),
    vocab       integer NOT NULL CHECK (vocab BETWEEN 8 AND 1048576),
    normalize   text NOT NULL,  -- "nfkc,lowercase,keep-accents", "none"
    special     text NOT NULL,  -- "[CLS],[SEP],[MASK],[PAD],[UNK]", "" for none
    created_at  timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE dataset ADD COLUMN trained_tokenizer text REFERENCES tokenizer (sha256);
ALTER TABLE dataset ADD COLUMN tokenizer_sha256 text REFERENCES tokenizer (sha256);
ALTER TABLE dataset ADD COLUMN vocab integer NOT NULL DEFAULT 256;
ALTER TABLE dataset ADD CONSTRAINT dataset_tokenizer_check
    CHECK (tokenizer IN ('byte', 'unigram', 'bpe')
           AND (tokenizer = 'byte') = (tokenizer_sha256 IS NULL)
           AND (tokenizer <> 'byte' OR vocab = 256));
