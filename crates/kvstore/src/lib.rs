//! Disk KV cache (spec §5.8): versioned, checksummed files holding a session's complete KV state (every
//! owned layer's raw window, compressed rows, indexer rows and compressor frontiers), its token ids, the
//! logits after the last token and the tool-id → DSML map; and a directory of them under a space budget,
//! looked up by the longest token prefix of a prompt.
pub mod format;
pub mod store;

pub use format::{load_file, model_identity, save_file, stage_identity, token_key, FormatError, Reason, Restored, StateRef};
pub use store::{Entry, KvStore, SaveOutcome, Stats};

#[cfg(test)]
mod tests;
