//! Batched decode: one token for each of several independent sequences, in one pass through the layers.
//! Every weight matrix is read once for the whole batch (the products take the rows together); the
//! attention, compressors, indexer and KV updates run per sequence on its own state. The row products
//! are row-independent (the Fast path quantizes each activation row on its own), so every sequence gets
//! bit-identical logits to a decode step run alone.
use crate::error::{ModelError, Result};
use crate::kv::KvState;
use crate::stage::{Logits, Stage};

impl Stage {
    /// One decode step for `kvs.len()` sequences: `tokens[s]` is fed to `kvs[s]` (at its own position).
    /// Returns one logit row per sequence (empty for a headless stage), in the order of `kvs`.
    /// `hidden_in` (one HC row per sequence) replaces the embedding for stages that don't start at layer 0.
    pub fn forward_batch(&mut self, kvs: &mut [&mut KvState], tokens: &[u32], hidden_in: Option<&[f32]>) -> Result<&[f32]> {
        if kvs.len() != tokens.len() {
            return Err(ModelError::Invalid(format!("batch of {} sequences with {} tokens", kvs.len(), tokens.len())));
        }
        let lens = vec![1; tokens.len()];
        self.forward_many(kvs, &lens, tokens, hidden_in, Logits::Last)
    }

    /// The general form: sequence `s` contributes `lens[s]` consecutive tokens (rows of `tokens`, in order
    /// of the sequences). `Logits::Last` gives the last row of every sequence, `All` every row.
    pub fn forward_many(&mut self, kvs: &mut [&mut KvState], lens: &[usize], tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits) -> Result<&[f32]> {
        let mut wk = self.take_work();
        let res = self.forward_spans(&mut wk, kvs, lens, tokens, hidden_in, want);
        self.put_work(wk);
        let m = res?;
        Ok(self.logits_rows(m))
    }
}

