//! The generation loop over a route, with the same contract as `ds4_engine::Session::generate`
//! (sample, count, stop at EOS / caller / full context, then feed the token), so `ds4`, `ds4-server`
//! and `ds4-bench` drive a route exactly as they drive a local session.
use crate::error::{DistError, Result};
use crate::route::DistSession;
use ds4_engine::{GenStats, StopReason};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

impl DistSession {
    /// Samples up to `max_tokens` tokens after [`DistSession::sync`]. With `greedy_at_last_stage`
    /// the last stage picks the greedy token and sends its id instead of the logits vector (only
    /// for deterministic greedy sampling: `sample` is then called once, on the prompt's logits).
    /// `on_token` returns false to stop.
    #[allow(clippy::too_many_arguments)]
    pub fn generate(
        &mut self,
        max_tokens: usize,
        eos: Option<u32>,
        greedy_at_last_stage: bool,
        sample: &mut dyn FnMut(&[f32]) -> u32,
        on_token: &mut dyn FnMut(u32) -> bool,
        cancel: &AtomicBool,
        stats: &mut GenStats,
    ) -> Result<StopReason> {
        if self.logits.is_empty() {
            return Err(DistError::Other("nothing to continue from: empty prompt".into()));
        }
        let t0 = Instant::now();
        let mut reason = StopReason::MaxTokens;
        let mut pending: Option<u32> = None;
        let r = (|| {
            for _ in 0..max_tokens {
                if cancel.load(Ordering::Relaxed) {
                    reason = StopReason::Cancelled;
                    break;
                }
                let tok = match pending.take() {
                    Some(t) => t,
                    None => sample(&self.logits),
                };
                stats.gen_tokens += 1;
                if Some(tok) == eos {
                    reason = StopReason::Eos;
                    break;
                }
                if !on_token(tok) {
                    reason = StopReason::Caller;
                    break;
                }
                if self.tokens.len() >= self.ctx() {
                    reason = StopReason::ContextFull;
                    break;
                }
                if greedy_at_last_stage {
                    pending = Some(self.step_greedy(tok, 0)?.id);
                } else {
                    self.step(tok)?;
                }
            }
            Ok(())
        })();
        stats.gen_time += t0.elapsed();
        r.map(|()| reason)
    }
}
