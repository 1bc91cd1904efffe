// The sequences of a step, from the step uniform (written once per step). A plain step is one
// sequence: the session in KV slot `slot`, rows 0 .. ntok at positions pos .. pos + ntok. A batched
// step (batch != 0) has one sequence per row: row t is one token of the session in slot rows[t].x at
// position rows[t].y (`pos` is then the largest of them). Slot s owns part s of every KV buffer.
// 64 rows: `gpu::MAX_BATCH_ROWS`.
struct Step { ntok: u32, pos: u32, batch: u32, slot: u32, rows: array<vec4<u32>, 64> }
struct Seq { slot: u32, pos: u32, row0: u32, n: u32 }

fn seq_count() -> u32 {
    return select(1u, step.ntok, step.batch != 0u);
}

fn seq_at(g: u32) -> Seq {
    if (step.batch != 0u) {
        let r = step.rows[min(g, 63u)];
        return Seq(r.x, r.y, g, 1u);
    }
    return Seq(step.slot, step.pos, 0u, step.ntok);
}

// The sequence of activation row t.
fn seq_of(t: u32) -> Seq {
    return seq_at(select(0u, t, step.batch != 0u));
}

// The position of activation row t.
fn row_pos(t: u32) -> u32 {
    let s = seq_of(t);
    return s.pos + t - s.row0;
}
