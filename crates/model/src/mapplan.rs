//! Map plans: the byte spans of the tensors a stage owns, sorted and coalesced, so that a shard whose
//! range covers the whole file is one mapping and a range of a full file is one mapping per contiguous
//! run (seed 000: one mapping per tensor span cost 77x in decode).
use std::ops::Range;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapPlan {
    /// Coalesced, sorted, non-overlapping file byte ranges.
    pub spans: Vec<Range<u64>>,
    /// How many tensor spans went in.
    pub n_tensor_spans: usize,
}

impl MapPlan {
    /// Coalesces `ranges`: overlapping ranges, and ranges separated only by alignment padding
    /// (a gap smaller than `align`), become one span.
    pub fn build(mut ranges: Vec<Range<u64>>, align: u64) -> Self {
        let n_tensor_spans = ranges.len();
        ranges.retain(|r| r.end > r.start);
        ranges.sort_by_key(|r| r.start);
        let mut spans: Vec<Range<u64>> = Vec::new();
        for r in ranges {
            match spans.last_mut() {
                Some(last) if r.start < last.end.saturating_add(align.max(1)) => last.end = last.end.max(r.end),
                _ => spans.push(r),
            }
        }
        Self { spans, n_tensor_spans }
    }

    pub fn bytes(&self) -> u64 {
        self.spans.iter().map(|r| r.end - r.start).sum()
    }

    /// Index of the span holding `[start, start+len)`.
    pub fn find(&self, start: u64, len: u64) -> Option<usize> {
        let i = self.spans.partition_point(|r| r.end <= start);
        (i < self.spans.len() && self.spans[i].start <= start && start + len <= self.spans[i].end).then_some(i)
    }

    /// The log line of design §4.
    pub fn describe(&self, layers: &str) -> String {
        format!(
            "restricting model map to layers {layers} ({} tensor spans -> {} mappings, {:.2} GiB)",
            self.n_tensor_spans,
            self.spans.len(),
            self.bytes() as f64 / (1u64 << 30) as f64
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_and_padded_spans_coalesce() {
        let p = MapPlan::build(vec![0..10, 32..40, 40..64, 200..300, 250..260], 32);
        assert_eq!(p.spans, vec![0..64, 200..300]);
        assert_eq!(p.n_tensor_spans, 5);
        assert_eq!(p.find(33, 5), Some(0));
        assert_eq!(p.find(210, 90), Some(1));
        assert_eq!(p.find(60, 10), None);
    }
}
