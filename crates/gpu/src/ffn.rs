//! The MoE feed-forward sub-layer as the order of its device ops. In a decode step the shared expert
//! runs on lane 1 (beside the entry's Sinkhorn matrix there) while the router and the routed experts
//! run on the main lane.
use crate::error::Result;
use crate::ops::{DeviceOps, Step, Sub};

/// `lanes` as for `attention`.
pub(crate) fn ffn<D: DeviceOps>(ops: &mut D, li: usize, step: Step, lanes: bool) -> Result<()> {
    let info = ops.layer(li);
    let dec = lanes;
    ops.hc_entry(li, Sub::Ffn, step)?;
    if info.shared_expert {
        if dec {
            ops.fork(1)?;
        }
        ops.shared_expert(li, step)?;
        if dec {
            ops.to_main();
        }
    }
    ops.route(li, step)?;
    ops.experts(li, step)?;
    if dec {
        ops.join(1)?;
    }
    ops.ffn_exit(li, step)
}
