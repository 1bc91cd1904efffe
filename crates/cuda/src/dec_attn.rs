//! Decode attention launches (attention_dec.cu), shared by the stage and the probes.
use crate::gpu::{Gpu, Result, A};

/// Candidates per chunk (ADEC_CH in attention_dec.cu); heads per attn_dec block (ADEC_HG).
pub(crate) const ADEC_CH: usize = 16;
const ADEC_HG: usize = 8;

/// One decode attention (one token at the device position `dpos`): the raw query `q` (the q_b
/// product; attn_dec applies the per-head norm with `eps` and the rope), this token's KV row `kvb`,
/// the layer's ring / compressed rows / selection, partial buffer `part` laid out for `nsplit`
/// chunks; the merge writes `o`, the ring slot of this token and, when `q80` is set, the Q8_0 copy.
pub(crate) struct DecAttn {
    pub q: u64,
    pub kvb: u64,
    pub ring: u64,
    pub comp: u64,
    pub sel: u64,
    pub sinks: u64,
    pub freqs: u64,
    pub part: u64,
    pub o: u64,
    pub q80: u64,
    pub d80: u64,
    pub dpos: u64,
    pub pos: i64,
    pub nh: usize,
    pub d: usize,
    pub half: usize,
    pub swa: usize,
    pub ratio: usize,
    pub topk: usize,
    pub nsplit: usize,
    pub eps: f32,
    /// Consecutive tokens of one sequence in one launch (grid z; a verify step's rows; 1 for decode):
    /// token r's query, KV row, selection, output and position follow token 0's at their row
    /// strides, its partials `pstride` floats on.
    pub rows: usize,
    pub pstride: usize,
}

impl DecAttn {
    /// Chunks for at most `max_cand` candidates: the partials' layout and the grid's upper bound
    /// (sized for the context's most candidates, so the captured launch fits every position).
    pub(crate) fn splits(max_cand: usize) -> usize { max_cand.div_ceil(ADEC_CH).max(1) }

    /// Floats of the partial buffer (outputs, then (max, sum) pairs) for `nsplit` chunks.
    pub(crate) fn part_floats(nsplit: usize, nh: usize, d: usize) -> usize { nsplit * nh * (d + 2) }

    /// The attention kernel for heads of `d` dims (the wide one holds twice the query registers).
    pub(crate) fn kernel(d: usize) -> &'static str { if d > 512 { "attn_dec_w" } else { "attn_dec" } }

    /// Dynamic shared memory of attn_dec: queries, chunk rows, scores, probabilities, rope table.
    pub(crate) fn smem(d: usize, half: usize) -> u32 { ((ADEC_HG * d + ADEC_CH * d + 2 * ADEC_HG * ADEC_CH + 2 * half) * 4) as u32 }

    pub(crate) fn launch(&self, g: &mut Gpu) -> Result<()> {
        let (nh, d, half) = (self.nh, self.d, self.half);
        if d % 4 != 0 || d > 1024 || 2 * half > d || (self.q80 != 0 && d % 32 != 0) {
            return Err(format!("decode attention: unsupported head dim {d} (rope {})", 2 * half));
        }
        // Blocks take chunks y, y + gridDim.y, ..: at most one wave of three blocks per SM (the
        // kernel's occupancy), so long contexts loop instead of launching blocks that find no
        // candidates. The grid depends on the context (nsplit), not on the position.
        let groups = nh.div_ceil(ADEC_HG);
        let gy = self.nsplit.min(g.sms.max(1) as usize * 3 / groups).max(1);
        let rows = self.rows.max(1) as u32;
        if rows > 1 && self.pstride < Self::part_floats(self.nsplit, nh, d) {
            return Err(format!("decode attention over {rows} tokens needs partials {} floats apart", Self::part_floats(self.nsplit, nh, d)));
        }
        let pstride = A::L(self.pstride as i64);
        let args = [
            A::P(self.q),
            A::P(self.kvb),
            A::P(self.ring),
            A::P(self.comp),
            A::P(self.sel),
            A::P(self.part),
            A::I(nh as i32),
            A::I(d as i32),
            A::L(self.pos),
            A::I(self.swa as i32),
            A::I(self.ratio as i32),
            A::I(self.topk as i32),
            A::I(self.nsplit as i32),
            A::P(self.dpos),
            A::P(self.freqs),
            A::I(half as i32),
            A::F(self.eps),
            pstride,
        ];
        g.launch(Self::kernel(d), (groups as u32, gy as u32, rows), 256, Self::smem(d, half), &args)?;
        let args = [
            A::P(self.part),
            A::P(self.sinks),
            A::P(self.o),
            A::I(nh as i32),
            A::I(d as i32),
            A::L(self.pos),
            A::I(self.nsplit as i32),
            A::I(self.swa as i32),
            A::I(self.ratio as i32),
            A::I(self.topk as i32),
            A::P(self.sel),
            A::P(self.freqs),
            A::I(half as i32),
            A::P(self.dpos),
            A::P(self.kvb),
            A::P(self.ring),
            A::P(self.q80),
            A::P(self.d80),
            pstride,
        ];
        g.launch("attn_dec_merge", (nh as u32, d.div_ceil(128) as u32, rows), 256, 0, &args)
    }
}
