//! Which host address ranges to register with the GPU when it reads the weights in place
//! (`--cuda-weights host`): the tensors' byte spans, widened to whole pages and merged where the pages
//! touch, so every tensor lies inside exactly one registration and no page is registered twice.

/// Page-aligned `(start, len)` ranges covering every `(addr, len)` span, sorted and disjoint.
pub fn page_ranges(spans: &[(usize, usize)], page: usize) -> Vec<(usize, usize)> {
    assert!(page.is_power_of_two(), "page size {page} is not a power of two");
    let mut v: Vec<(usize, usize)> = spans.iter().filter(|s| s.1 > 0).map(|&(a, n)| (a & !(page - 1), (a + n).next_multiple_of(page))).collect();
    v.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (s, e) in v {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out.into_iter().map(|(s, e)| (s, e - s)).collect()
}

/// The range of `ranges` (from [`page_ranges`]) holding the span at `addr`, and the offset in it.
pub fn locate(ranges: &[(usize, usize)], addr: usize) -> Option<(usize, usize)> {
    let i = ranges.partition_point(|r| r.0 <= addr).checked_sub(1)?;
    let (s, n) = ranges[i];
    (addr < s + n).then_some((i, addr - s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_widen_to_pages_and_merge_where_pages_touch() {
        // Two tensors sharing page 1, one on page 3 alone, an empty span ignored, out of order.
        let spans = [(3 * 4096 + 100, 50), (10, 4096 + 5), (4096 + 200, 10), (9 * 4096, 0)];
        let r = page_ranges(&spans, 4096);
        assert_eq!(r, vec![(0, 2 * 4096), (3 * 4096, 4096)]);
        // Adjacent pages merge into one registration.
        assert_eq!(page_ranges(&[(0, 4096), (4096, 1)], 4096), vec![(0, 2 * 4096)]);
        // Every span lies inside the range `locate` names.
        for &(a, n) in &spans[..3] {
            let (i, off) = locate(&r, a).unwrap();
            assert!(off + n <= r[i].1 && r[i].0 + off == a);
        }
        assert_eq!(locate(&r, 2 * 4096 + 5), None);
        assert_eq!(locate(&r, 5 * 4096), None);
    }
}
