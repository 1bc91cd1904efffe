// Compressor of one step, in parallel (the result of ds4_model::compressor::push token after token):
// token t at position q = pos + t writes its kv row and score (gate + ape[q % ratio]) into frontier
// row q % ratio (ratio 4: row 4 + q % 4, rows 0..3 hold the last closed window); window c closes at
// position c * ratio + ratio - 1 and pools, per channel, the softmax of its rows' scores (ratio 4:
// the previous window's channels [0, d) then its own channels [d, 2d)). compressor_pool.wgsl pools
// every window closed in the step, reading each position from this step's inputs or, before `pos`,
// from the frontier as the step found it; compressor_state.wgsl then leaves the frontier as the
// sequential pushes would. Every sequence of the step (seq.wgsl) has its own frontier (slot s: rows
// s * nrows ..) and its own output rows (slot s: rows s * cap ..); a batched step runs each row's
// sequence on its own (workgroup z = the sequence).
struct Params { d: u32, width: u32, ratio: u32, cap: u32 }

// Scores at or below this are the -inf of rows never written.
const NEG: f32 = -3.4028235e38;

// Frontier rows of a slot.
fn state_rows() -> u32 {
    return select(p.ratio, 8u, p.ratio == 4u);
}

// Frontier row holding position q < pos0 (as the step found the frontier of a sequence at pos0).
fn state_row(q: u32, pos0: u32) -> u32 {
    if (p.ratio == 4u) {
        return select(q % 4u, 4u + q % 4u, q / 4u == pos0 / 4u);
    }
    return q % p.ratio;
}
