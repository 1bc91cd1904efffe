//! The attention sub-layer as the order of its device ops. In a decode step three independent chains
//! run on side lanes beside the query path (each is latency-bound alone): the shared KV row (lane 1),
//! the compressors (lanes 2 and 5), the indexer's head weights (lane 3); the indexer's query follows
//! the low-rank query on lane 1. Everything joins before the indexer selection.
use crate::error::Result;
use crate::ops::{Compressor, DeviceOps, Step, Sub};
use ds4_model::Config;

/// `lanes`: run the side chains on their lanes (a decode step, or a verify step whose rows the backend
/// computes as decode steps).
pub(crate) fn attention<D: DeviceOps>(ops: &mut D, cfg: &Config, li: usize, step: Step, lanes: bool) -> Result<()> {
    let info = ops.layer(li);
    let dec = lanes;
    ops.hc_entry(li, Sub::Attn, step)?;
    if dec {
        ops.fork(1)?;
    }
    ops.kv_row(li, step)?;
    if dec {
        ops.to_main();
        ops.fork(2)?;
    }
    let mut idx_comp = false;
    if info.ratio != 0 {
        ops.compress(li, Compressor::Kv, step)?;
        if info.indexer {
            if dec {
                ops.to_main();
                ops.fork(5)?;
            }
            ops.compress(li, Compressor::Indexer, step)?;
            idx_comp = dec;
        }
    }
    if dec {
        ops.to_main();
    }
    // The indexer selects only once a token sees more compressed rows than top_k (a decode step is
    // recorded for every position, and a batch's rows have their own positions, so both always run
    // the selection: the backend skips the rows that see at most top_k).
    let nc_last = if info.ratio != 0 { (step.pos0 + step.n) / info.ratio } else { 0 };
    let idx_active = info.indexer && (nc_last > cfg.idx_topk || step.decode || step.batch);
    if dec && idx_active {
        ops.fork(3)?;
        ops.indexer_weights(li, step)?;
        ops.to_main();
    }
    ops.q_lora(li, step)?;
    if idx_active {
        if dec {
            ops.fork(1)?;
        }
        ops.indexer_query(li, step)?;
        if dec {
            ops.to_main();
        } else {
            ops.indexer_weights(li, step)?;
        }
    }
    ops.q_heads(li, step)?;
    if dec {
        ops.join(1)?;
        ops.join(2)?;
        if idx_active {
            ops.join(3)?;
        }
        if idx_comp {
            ops.join(5)?;
        }
    }
    if idx_active {
        ops.indexer_select(li, step)?;
    }
    ops.attend(li, step, idx_active)?;
    ops.attn_out(li, step)
}
