//! What a chat runs on: this process's engine or a distributed route, behind one trait.
use ds4_dist::cli::CoordinatorSetup;
use ds4_engine::{Engine, GenStats, Session, SpecSampler, StopReason};
use ds4_tokenizer::Tokenizer;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// What a chat runs on: this process's engine ([`Local`]) or a distributed route (the coordinator's
/// [`CoordinatorSetup`]); both keep the conversation's tokens and continue from them.
pub trait Conversation {
    fn tokenizer(&self) -> Arc<Tokenizer>;
    fn ctx(&self) -> usize;
    fn n_vocab(&self) -> usize;
    fn tokens(&self) -> &[u32];
    fn prefill_chunk(&self) -> usize;
    fn reset(&mut self);
    /// `/ctx N`: a new context size (the conversation is cleared); returns a line on its memory.
    fn set_ctx(&mut self, n: usize) -> Result<String, String>;
    /// `/steer [F]`: the first steering slot's FFN scale set to F (the KV state is kept), or with
    /// None only reported; returns the slots' (ffn, attn) scales.
    fn steer(&mut self, _ffn: Option<f32>) -> Result<Vec<(f32, f32)>, String> {
        Err("/steer is not available on a distributed route".into())
    }
    /// Makes the conversation hold exactly `prompt` (prefix reuse); returns the tokens prefilled.
    fn sync(&mut self, prompt: &[u32], progress: &mut dyn FnMut(usize, usize), cancel: &AtomicBool) -> Result<usize, String>;
    /// `greedy`: the sampler is deterministic argmax (a route lets its last stage pick the token).
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &mut self,
        max_tokens: usize,
        eos: u32,
        greedy: bool,
        sample: &mut dyn FnMut(&[f32]) -> u32,
        on_token: &mut dyn FnMut(u32) -> bool,
        cancel: &AtomicBool,
        stats: &mut GenStats,
    ) -> Result<StopReason, String>;
    /// True when `generate_speculative` drafts with MTP (`--mtp`).
    fn speculative(&self) -> bool { false }
    /// `generate` with MTP drafts verified by the model (same greedy output, same distribution).
    fn generate_speculative(
        &mut self,
        _max_tokens: usize,
        _eos: u32,
        _sampler: &mut dyn SpecSampler,
        _on_token: &mut dyn FnMut(u32) -> bool,
        _cancel: &AtomicBool,
        _stats: &mut GenStats,
    ) -> Result<StopReason, String> {
        Err("MTP speculative decoding is not available here".into())
    }
}

pub struct Local {
    pub eng: Engine,
    pub session: Session,
    pub tokenizer: Arc<Tokenizer>,
}

impl Conversation for Local {
    fn tokenizer(&self) -> Arc<Tokenizer> { self.tokenizer.clone() }
    fn ctx(&self) -> usize { self.eng.ctx }
    fn n_vocab(&self) -> usize { self.eng.cfg().n_vocab }
    fn tokens(&self) -> &[u32] { &self.session.tokens }
    fn prefill_chunk(&self) -> usize { self.session.prefill_chunk }
    fn reset(&mut self) { self.session.reset(&self.eng); }
    fn steer(&mut self, ffn: Option<f32>) -> Result<Vec<(f32, f32)>, String> {
        if let Some(v) = ffn {
            self.eng.set_steering_ffn(0, v).map_err(|e| e.to_string())?;
        }
        self.eng.steering().map(|s| s.scales()).ok_or_else(|| "no steering loaded: start ds4 with --dir-steering-file FILE".into())
    }
    fn set_ctx(&mut self, n: usize) -> Result<String, String> {
        // Admitted by the memory plan as `--ctx N` at startup; a refusal keeps the conversation.
        let budget = self.eng.budget();
        let line = self.eng.set_ctx(n).map_err(|e| e.to_string())?.describe(budget);
        let chunk = self.session.prefill_chunk;
        // The old KV state is freed before the new one is allocated: the plan counts one of them.
        self.session.kv.layers = Vec::new();
        self.session = Session::new(&self.eng);
        self.session.prefill_chunk = chunk;
        Ok(line)
    }
    fn sync(&mut self, prompt: &[u32], progress: &mut dyn FnMut(usize, usize), cancel: &AtomicBool) -> Result<usize, String> {
        self.session.sync(&mut self.eng, prompt, progress, cancel).map_err(|e| e.to_string())
    }
    fn generate(
        &mut self,
        max_tokens: usize,
        eos: u32,
        greedy: bool,
        sample: &mut dyn FnMut(&[f32]) -> u32,
        on_token: &mut dyn FnMut(u32) -> bool,
        cancel: &AtomicBool,
        stats: &mut GenStats,
    ) -> Result<StopReason, String> {
        self.session.generate(&mut self.eng, max_tokens, Some(eos), greedy, sample, on_token, cancel, stats).map_err(|e| e.to_string())
    }
    fn speculative(&self) -> bool { self.session.speculative() }
    fn generate_speculative(
        &mut self,
        max_tokens: usize,
        eos: u32,
        sampler: &mut dyn SpecSampler,
        on_token: &mut dyn FnMut(u32) -> bool,
        cancel: &AtomicBool,
        stats: &mut GenStats,
    ) -> Result<StopReason, String> {
        self.session.generate_speculative(&mut self.eng, max_tokens, Some(eos), sampler, on_token, cancel, stats).map_err(|e| e.to_string())
    }
}

/// The coordinator's route: local layers 0:K, then the workers.
pub struct Route {
    pub setup: CoordinatorSetup,
    pub tokenizer: Arc<Tokenizer>,
}

impl Conversation for Route {
    fn tokenizer(&self) -> Arc<Tokenizer> { self.tokenizer.clone() }
    fn ctx(&self) -> usize { self.setup.session.ctx() }
    fn n_vocab(&self) -> usize { self.setup.cfg.n_vocab }
    fn tokens(&self) -> &[u32] { &self.setup.session.tokens }
    fn prefill_chunk(&self) -> usize { self.setup.session.opts.prefill_chunk }
    fn reset(&mut self) { self.setup.session.reset(); }
    fn set_ctx(&mut self, _n: usize) -> Result<String, String> {
        Err("/ctx is not available on a distributed route (the workers registered with the coordinator's --ctx)".into())
    }
    fn sync(&mut self, prompt: &[u32], progress: &mut dyn FnMut(usize, usize), cancel: &AtomicBool) -> Result<usize, String> {
        let s = &mut self.setup.session;
        let reuse = !s.tokens.is_empty() && prompt.len() > s.tokens.len() && prompt.starts_with(&s.tokens);
        let todo = prompt.len() - if reuse { s.tokens.len() } else { 0 };
        s.sync_cancellable(prompt, cancel).map_err(|e| e.to_string())?;
        progress(todo, todo);
        Ok(todo)
    }
    fn generate(
        &mut self,
        max_tokens: usize,
        eos: u32,
        greedy: bool,
        sample: &mut dyn FnMut(&[f32]) -> u32,
        on_token: &mut dyn FnMut(u32) -> bool,
        cancel: &AtomicBool,
        stats: &mut GenStats,
    ) -> Result<StopReason, String> {
        self.setup.session.generate(max_tokens, Some(eos), greedy, sample, on_token, cancel, stats).map_err(|e| e.to_string())
    }
}
