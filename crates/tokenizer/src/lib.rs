//! Tokenizer, chat rendering, DSML parsing, sampling.
