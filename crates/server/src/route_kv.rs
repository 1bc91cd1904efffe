//! Coordinator mode (`--role coordinator --layers 0:K --listen HOST PORT`): the conversation runs on a
//! route of stages — this process's layers 0:K, then the registered workers in layer order — through
//! `ds4_dist::DistSession`, the same stage code a single process uses. Reuse is by token prefix only
//! (KV held by workers is neither snapshotted nor saved to disk): a prompt that extends the live
//! tokens prefills only the suffix, anything else starts over. A failed stage fails the request with
//! an error naming it (502); while the route is incomplete requests fail at once with the missing
//! layer (503); once a worker registers again the next request rebuilds its KV (replay) and runs.
use crate::errors::ApiError;
use crate::kv_reuse::{Decision, Prepared};
use axum::http::StatusCode;
use ds4_dist::{Coordinator, DistError, DistSession};
use ds4_engine::{GenStats, StopReason};
use std::sync::atomic::AtomicBool;

pub struct RouteKv {
    pub session: DistSession,
    pub n_vocab: usize,
}

/// The route's failure as the client sees it.
pub fn api_error(e: &DistError) -> ApiError {
    match e {
        DistError::Incomplete(_) => ApiError::unavailable(format!("distributed {e}")).code("route_incomplete"),
        DistError::Stage(_) => ApiError::new(StatusCode::BAD_GATEWAY, format!("distributed route: {e}")).code("stage_failed"),
        _ => ApiError::internal(format!("distributed route: {e}")),
    }
}

impl RouteKv {
    pub fn ctx(&self) -> usize { self.session.ctx() }

    /// "complete", or why the route is incomplete (for /health).
    pub fn status(coordinator: &Coordinator) -> String {
        match coordinator.plan() {
            Ok(_) => "complete".into(),
            Err(e) => e.to_string(),
        }
    }

    /// Prefills what the live tokens lack; stops between chunks once `cancel` is set.
    pub fn prepare(&mut self, prompt: Vec<u32>, cancel: &AtomicBool) -> Result<Prepared, ApiError> {
        let live = &self.session.tokens;
        let live_len = live.len();
        let live_common = live.iter().zip(&prompt).take_while(|(a, b)| a == b).count();
        let extend = live_len > 0 && live_common == live_len && prompt.len() > live_len;
        let cached = if extend { live_len } else { 0 };
        self.session.sync_cancellable(&prompt, cancel).map_err(|e| api_error(&e))?;
        let prefilled = prompt.len() - cached;
        Ok(Prepared { prompt, cached, prefilled, decision: if extend { Decision::Extend } else { Decision::Cold }, live_common, live_len })
    }

    /// Greedy requests (temperature 0 or top_k 1, not scripted) let the last stage pick the token.
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
    ) -> Result<StopReason, ApiError> {
        self.session.generate(max_tokens, eos, greedy_at_last_stage, sample, on_token, cancel, stats).map_err(|e| api_error(&e))
    }

    pub fn reset(&mut self) { self.session.reset(); }
}
